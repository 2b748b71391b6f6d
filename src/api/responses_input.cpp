#include "api/responses_input.h"

#include "api/errors.h"

namespace armada::api {

namespace {

std::string text_of(const json & content, const char * where) {
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array())
        throw ApiError(400, std::string(where) + " content must be a string or a list of parts", "input");
    std::string out;
    for (const auto & p : content) {
        const std::string t = p.is_object() ? get_string(p, "type") : "";
        if (t != "input_text" && t != "output_text" && t != "text") {
            throw ApiError(400, "only text content parts are supported (got '" + t + "')", "input");
        }
        if (!out.empty()) out += "\n";
        out += get_string(p, "text");
    }
    return out;
}

}  // namespace

void append_input(const json & input, std::vector<common_chat_msg> & msgs) {
    if (input.is_string()) {
        common_chat_msg m;
        m.role = "user";
        m.content = input.get<std::string>();
        msgs.push_back(m);
        return;
    }
    if (!input.is_array()) throw ApiError(400, "'input' must be a string or a list of items", "input");
    for (const auto & it : input) {
        if (!it.is_object()) throw ApiError(400, "each input item must be an object", "input");
        const std::string type = get_string(it, "type", "message");
        if (type == "message") {
            common_chat_msg m;
            m.role = get_string(it, "role");
            if (m.role == "developer") m.role = "system";
            if (m.role != "user" && m.role != "system" && m.role != "assistant") {
                throw ApiError(400, "input message role must be user, system, developer or assistant", "input");
            }
            m.content = text_of(it.contains("content") ? it["content"] : json(""), "message");
            msgs.push_back(m);
        } else if (type == "function_call") {
            common_chat_tool_call c{get_string(it, "name"), get_string(it, "arguments", "{}"),
                                    get_string(it, "call_id")};
            if (msgs.empty() || msgs.back().role != "assistant" || msgs.back().tool_calls.empty()) {
                common_chat_msg m;
                m.role = "assistant";
                msgs.push_back(m);
            }
            msgs.back().tool_calls.push_back(c);
        } else if (type == "function_call_output") {
            common_chat_msg m;
            m.role = "tool";
            m.tool_call_id = get_string(it, "call_id");
            if (m.tool_call_id.empty()) throw ApiError(400, "function_call_output needs call_id", "input");
            const json & o = it.contains("output") ? it["output"] : json("");
            m.content = o.is_string() ? o.get<std::string>() : dump(o);
            msgs.push_back(m);
        } else {
            throw ApiError(400, "input item type '" + type + "' is not supported", "input");
        }
    }
}

json msgs_to_json(const std::vector<common_chat_msg> & msgs) {
    json a = json::array();
    for (const auto & m : msgs) {
        json calls = json::array();
        for (const auto & c : m.tool_calls)
            calls.push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
        a.push_back(
            {{"role", m.role}, {"content", m.content}, {"tool_call_id", m.tool_call_id}, {"tool_calls", calls}});
    }
    return a;
}

std::vector<common_chat_msg> msgs_from_json(const json & a) {
    std::vector<common_chat_msg> out;
    for (const auto & j : a) {
        common_chat_msg m;
        m.role = j.value("role", "user");
        m.content = j.value("content", "");
        m.tool_call_id = j.value("tool_call_id", "");
        for (const auto & c : j.value("tool_calls", json::array())) {
            m.tool_calls.push_back({c.value("name", ""), c.value("arguments", ""), c.value("id", "")});
        }
        out.push_back(m);
    }
    return out;
}

}  // namespace armada::api

#include "agent/transcript_json.h"

#include "common/json_fields.h"

namespace armada::agent {

using json = nlohmann::json;

json message_json(const common_chat_msg & m) {
    json j = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
        json calls = json::array();
        for (const auto & c : m.tool_calls) {
            calls.push_back(
                {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        j["tool_calls"] = calls;
        if (m.content.empty()) j["content"] = nullptr;
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.tool_name.empty()) j["name"] = m.tool_name;
    return j;
}

common_chat_msg assistant_message(const json & p) {
    common_chat_msg m;
    m.role = "assistant";
    m.content = common::string_field(p, "content").value_or("");
    if (const auto * calls = common::array_field(p, "tool_calls")) {
        for (const auto & c : *calls)
            m.tool_calls.push_back({common::string_field(c, "name").value_or(""),
                                    common::string_field(c, "arguments").value_or(""),
                                    common::string_field(c, "id").value_or("")});
    }
    return m;
}

}  // namespace armada::agent

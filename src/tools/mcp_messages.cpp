#include "tools/mcp_messages.h"

#include "common/json_fields.h"
#include "net/sse.h"
#include "tools/charset.h"

namespace armada::tools {

using json = nlohmann::json;

namespace {

std::string str_field(const json & o, const char * name, const std::string & def = {}) {
    return common::string_field(o, name).value_or(def);
}

json parse(const std::string & text) {
    // No exceptions, and a depth cap through nlohmann's own limit on recursion is not available:
    // the body size is capped by the HTTP client (8 MiB) and nlohmann parses iteratively.
    return json::parse(text, nullptr, false);
}

// Finds the JSON-RPC message answering `id` in a JSON body or an SSE stream.
json find_response(const std::string & body, const std::string & content_type, const json & id) {
    if (content_type.find("text/event-stream") == std::string::npos) return parse(body);
    json found;
    const net::SseReader::Handler check = [&](net::SseEvent & ev) {
        json j = parse(ev.data);
        if (!j.is_object() || !j.contains("id") || j["id"] != id) return true;
        found = std::move(j);
        return false;
    };
    net::SseReader reader;
    if (reader.feed(body, check)) reader.finish(check);
    return found;
}

std::string error_text(const json & e) {
    if (e.is_object()) {
        std::string msg = str_field(e, "message");
        auto code = e.find("code");
        const std::string c = code != e.end() && code->is_number_integer() ? std::to_string(code->get<int64_t>()) : "?";
        return "MCP error " + c + ": " + msg;
    }
    return "MCP error: " + e.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 200);
}

}  // namespace

json mcp_answer(int status, const std::string & body, const std::string & content_type, const json & id,
                std::string & err) {
    if (status >= 400) {
        err = "the MCP server answered HTTP " + std::to_string(status);
        json j = parse(body);
        if (j.is_object() && j.contains("error")) {
            const json & e = j["error"];
            err += ": " + (e.is_object() ? str_field(e, "message") : std::string("(malformed error)"));
        }
        return json();
    }
    json j = find_response(body, content_type, id);
    if (!j.is_object()) {
        err = "the MCP server sent no JSON-RPC answer";
        return json();
    }
    if (j.contains("error")) {
        err = error_text(j["error"]);
        return json();
    }
    auto it = j.find("result");
    if (it == j.end()) return json::object();
    if (!it->is_object()) {
        err = "the MCP server's result is not an object";
        return json();
    }
    return *it;
}

void mcp_tools_page(const json & result, const std::set<std::string> & allowed, std::vector<HttpToolSpec> & out,
                    std::string & cursor) {
    cursor = str_field(result, "nextCursor");
    if (!result.is_object()) return;
    auto tools = result.find("tools");
    if (tools == result.end() || !tools->is_array()) return;
    for (const auto & t : *tools) {
        const std::string name = str_field(t, "name");
        if (name.empty() || (!allowed.empty() && !allowed.count(name))) continue;
        HttpToolSpec s;
        s.name = name;
        s.description = str_field(t, "description");
        auto schema = t.find("inputSchema");
        s.parameters = schema != t.end() && schema->is_object()
                           ? schema->dump(-1, ' ', false, json::error_handler_t::replace)
                           : json{{"type", "object"}}.dump();
        out.push_back(std::move(s));
    }
}

ToolResult mcp_call_result(const json & result) {
    ToolResult r;
    std::string text;
    auto add = [&](const std::string & s) {
        if (!text.empty()) text += "\n";
        text += s;
    };
    if (result.is_object()) {
        auto content = result.find("content");
        if (content != result.end() && content->is_array()) {
            for (const auto & c : *content) {
                const std::string type = str_field(c, "type", "content");
                add(type == "text" ? str_field(c, "text") : "[" + type + "]");
            }
        }
        auto sc = result.find("structuredContent");
        if (sc != result.end()) add(sc->dump(-1, ' ', false, json::error_handler_t::replace));
        auto e = result.find("isError");
        r.is_error = e != result.end() && e->is_boolean() && e->get<bool>();
    }
    r.content = to_utf8(text, "utf-8");
    r.http_status = 200;
    return r;
}

std::string mcp_protocol_version(const json & result) {
    return str_field(result, "protocolVersion");
}

}  // namespace armada::tools

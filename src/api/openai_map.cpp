#include "api/openai_map.h"

#include "api/errors.h"

#include <cmath>
#include <set>

namespace armada::api {

namespace {

float get_float(const json & body, const char * key, float def, float lo, float hi) {
    const double v = get_number(body, key, def);
    if (!std::isfinite(v) || v < lo || v > hi) {
        throw ApiError(
            400, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi),
            key);
    }
    return float(v);
}

std::vector<std::string> parse_stop(const json & body, const RequestLimits & lim) {
    std::vector<std::string> out;
    auto it = body.find("stop");
    if (it == body.end() || it->is_null()) return out;
    if (it->is_string()) {
        out.push_back(it->get<std::string>());
    } else if (it->is_array()) {
        if (int32_t(it->size()) > lim.max_stop) {
            throw ApiError(400, "'stop' may hold at most " + std::to_string(lim.max_stop) + " strings", "stop");
        }
        for (const auto & s : *it) {
            if (!s.is_string()) throw ApiError(400, "'stop' entries must be strings", "stop");
            out.push_back(s.get<std::string>());
        }
    } else {
        throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
    }
    for (const auto & s : out) {
        if (int32_t(s.size()) > lim.max_stop_len) throw ApiError(400, "a 'stop' string is too long", "stop");
    }
    return out;
}

std::vector<llama_logit_bias> parse_logit_bias(const json & body, int32_t n_vocab) {
    std::vector<llama_logit_bias> out;
    auto it = body.find("logit_bias");
    if (it == body.end() || it->is_null()) return out;
    if (!it->is_object()) throw ApiError(400, "'logit_bias' must be an object of token id to bias", "logit_bias");
    for (const auto & [k, v] : it->items()) {
        size_t used = 0;
        long long id = -1;
        try {
            id = std::stoll(k, &used);
        } catch (...) {
            used = 0;
        }
        if (used != k.size() || k.empty()) {
            throw ApiError(400, "'logit_bias' key '" + k + "' is not a token id", "logit_bias");
        }
        if (id < 0 || id >= n_vocab) {
            throw ApiError(
                400,
                "'logit_bias' token id " + k + " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")",
                "logit_bias");
        }
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 || v.get<double>() > 100) {
            throw ApiError(400, "'logit_bias' values must be numbers between -100 and 100", "logit_bias");
        }
        out.push_back({llama_token(id), float(v.get<double>())});
    }
    return out;
}

void parse_response_format(const json & body, SamplingSpec & s) {
    auto it = body.find("response_format");
    if (it == body.end() || it->is_null()) return;
    if (!it->is_object()) throw ApiError(400, "'response_format' must be an object", "response_format");
    const std::string type = get_string(*it, "type", "text");
    if (type == "text") return;
    if (type == "json_object") {
        s.json_object = true;
        return;
    }
    if (type != "json_schema") {
        throw ApiError(400, "'response_format.type' must be text, json_object or json_schema", "response_format");
    }
    auto js = it->find("json_schema");
    if (js == it->end() || !js->is_object()) {
        throw ApiError(400, "'response_format.json_schema' must be an object", "response_format");
    }
    auto schema = js->find("schema");
    if (schema == js->end() || !schema->is_object()) {
        throw ApiError(400, "'response_format.json_schema.schema' must be an object", "response_format");
    }
    s.json_schema = dump(*schema);
}

std::string content_text(const json & content, const char * where) {
    if (content.is_null()) return {};
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array())
        throw ApiError(400, std::string(where) + " content must be a string or an array", "messages");
    std::string out;
    for (const auto & part : content) {
        if (!part.is_object() || get_string(part, "type") != "text") {
            throw ApiError(400, "only text content parts are supported", "messages");
        }
        if (!out.empty()) out += "\n";
        out += get_string(part, "text");
    }
    return out;
}

common_chat_msg parse_message(const json & m, size_t i) {
    if (!m.is_object()) throw ApiError(400, "messages[" + std::to_string(i) + "] must be an object", "messages");
    common_chat_msg msg;
    msg.role = get_string(m, "role");
    if (msg.role == "developer") msg.role = "system";
    static const std::set<std::string> roles = {"system", "user", "assistant", "tool"};
    if (!roles.count(msg.role)) {
        throw ApiError(400,
                       "messages[" + std::to_string(i) + "].role '" + msg.role +
                           "' is not one of system, developer, user, assistant, tool",
                       "messages");
    }
    msg.content = content_text(m.contains("content") ? m["content"] : json(nullptr), "message");
    if (msg.role == "tool") {
        msg.tool_call_id = get_string(m, "tool_call_id");
        if (msg.tool_call_id.empty()) {
            throw ApiError(400, "messages[" + std::to_string(i) + "] is a tool result without tool_call_id",
                           "messages");
        }
    }
    if (msg.role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        const auto & calls = m["tool_calls"];
        if (!calls.is_array()) throw ApiError(400, "'tool_calls' must be an array", "messages");
        for (const auto & c : calls) {
            if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) {
                throw ApiError(400, "each tool call needs a 'function' object", "messages");
            }
            common_chat_tool_call tc;
            tc.id = get_string(c, "id");
            tc.name = get_string(c["function"], "name");
            const auto & args = c["function"].contains("arguments") ? c["function"]["arguments"] : json("{}");
            tc.arguments = args.is_string() ? args.get<std::string>() : dump(args);
            msg.tool_calls.push_back(std::move(tc));
        }
    }
    return msg;
}

void check_tool_results(const std::vector<common_chat_msg> & msgs) {
    std::set<std::string> call_ids;
    for (const auto & m : msgs) {
        for (const auto & c : m.tool_calls)
            call_ids.insert(c.id);
        if (m.role == "tool" && !call_ids.count(m.tool_call_id)) {
            throw ApiError(400, "tool result '" + m.tool_call_id + "' answers no earlier assistant tool call",
                           "messages");
        }
    }
}

}  // namespace

void check_tool_schema(const json & params, const std::string & tool_name) {
    if (!params.is_object()) {
        throw ApiError(400, "tool '" + tool_name + "': 'parameters' must be a JSON Schema object", "tools");
    }
    if (params.contains("type") && !params["type"].is_string() && !params["type"].is_array()) {
        throw ApiError(400, "tool '" + tool_name + "': schema 'type' must be a string or array", "tools");
    }
    if (params.contains("properties") && !params["properties"].is_object()) {
        throw ApiError(400, "tool '" + tool_name + "': schema 'properties' must be an object", "tools");
    }
    if (params.contains("required") && !params["required"].is_array()) {
        throw ApiError(400, "tool '" + tool_name + "': schema 'required' must be an array", "tools");
    }
}

SamplingSpec parse_sampling(const json & body, int32_t n_vocab, const RequestLimits & lim) {
    SamplingSpec s;
    s.temperature = get_float(body, "temperature", s.temperature, 0.0f, 2.0f);
    s.top_p = get_float(body, "top_p", s.top_p, 0.0f, 1.0f);
    s.min_p = get_float(body, "min_p", s.min_p, 0.0f, 1.0f);
    s.repeat_penalty = get_float(body, "repeat_penalty", s.repeat_penalty, 0.01f, 10.0f);
    s.frequency_penalty = get_float(body, "frequency_penalty", s.frequency_penalty, -2.0f, 2.0f);
    s.presence_penalty = get_float(body, "presence_penalty", s.presence_penalty, -2.0f, 2.0f);
    const int64_t top_k = get_int(body, "top_k", s.top_k);
    if (top_k < 0 || top_k > n_vocab) throw ApiError(400, "'top_k' must be between 0 and the vocabulary size", "top_k");
    s.top_k = int32_t(top_k);
    const int64_t last_n = get_int(body, "repeat_last_n", s.repeat_last_n);
    if (last_n < -1 || last_n > 1 << 20) throw ApiError(400, "'repeat_last_n' is out of range", "repeat_last_n");
    s.repeat_last_n = int32_t(last_n);
    if (body.contains("seed") && !body["seed"].is_null()) {
        const int64_t seed = get_int(body, "seed", 0);
        s.seed = uint32_t(uint64_t(seed) & 0xffffffffu);
    }
    s.logit_bias = parse_logit_bias(body, n_vocab);
    int64_t max_tokens = get_int(body, "max_completion_tokens", -1);
    if (max_tokens < 0) max_tokens = get_int(body, "max_tokens", -1);
    if (body.contains("max_tokens") && !body["max_tokens"].is_null() && get_int(body, "max_tokens", 0) < 0) {
        throw ApiError(400, "'max_tokens' must be positive", "max_tokens");
    }
    if (max_tokens == 0) throw ApiError(400, "'max_tokens' must be at least 1", "max_tokens");
    if (lim.max_tokens > 0 && max_tokens > lim.max_tokens) {
        throw ApiError(400,
                       "'max_tokens' is too large: " + std::to_string(max_tokens) + "; each sequence holds at most " +
                           std::to_string(lim.max_tokens) + " tokens, prompt included",
                       "max_tokens");
    }
    s.max_tokens = int32_t(std::min<int64_t>(max_tokens, INT32_MAX));
    s.stop = parse_stop(body, lim);
    const int64_t n = get_int(body, "n", 1);
    if (n < 1 || n > lim.max_n) throw ApiError(400, "'n' must be between 1 and " + std::to_string(lim.max_n), "n");
    s.n = int32_t(n);
    s.stream = get_bool(body, "stream", false);
    if (body.contains("stream_options") && body["stream_options"].is_object()) {
        s.include_usage = get_bool(body["stream_options"], "include_usage", false);
    }
    // Log-probabilities: chat asks with logprobs: true and top_logprobs: N; /v1/completions with
    // logprobs: N (its legacy form); llama.cpp's n_probs is the same count. At most 20 (OpenAI's
    // bound); out-of-range values are refused (they once crashed other servers).
    auto count = [&](const char * field) -> std::optional<int64_t> {
        auto it = body.find(field);
        if (it == body.end() || it->is_null() || it->is_boolean()) return std::nullopt;
        const int64_t v = get_int(body, field, 0);
        if (v < 0 || v > 20) throw ApiError(400, "'" + std::string(field) + "' must be between 0 and 20", field);
        return v;
    };
    auto lp = body.find("logprobs");
    const bool want = lp != body.end() && ((lp->is_boolean() && lp->get<bool>()) || lp->is_number());
    if (lp != body.end() && !lp->is_null() && !lp->is_boolean() && !lp->is_number())
        throw ApiError(400, "'logprobs' must be true, false or a number", "logprobs");
    const auto legacy = count("logprobs");
    const auto top = count("top_logprobs");
    const auto n_probs = count("n_probs");
    if (top && !want) throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    if (want) s.logprobs = int32_t(top ? *top : legacy ? *legacy : 0);
    if (n_probs && *n_probs > 0) s.logprobs = int32_t(*n_probs);
    s.grammar = get_string(body, "grammar");
    parse_response_format(body, s);
    return s;
}

ChatSpec parse_chat(const json & body, int32_t n_vocab, const RequestLimits & lim) {
    ChatSpec c;
    auto msgs = body.find("messages");
    if (msgs == body.end() || !msgs->is_array()) throw ApiError(400, "'messages' must be an array", "messages");
    if (msgs->empty()) throw ApiError(400, "'messages' must not be empty", "messages");
    for (size_t i = 0; i < msgs->size(); ++i)
        c.messages.push_back(parse_message((*msgs)[i], i));
    check_tool_results(c.messages);

    auto tools = body.find("tools");
    if (tools != body.end() && !tools->is_null()) {
        if (!tools->is_array()) throw ApiError(400, "'tools' must be an array", "tools");
        if (int32_t(tools->size()) > lim.max_tools) throw ApiError(400, "too many tools", "tools");
        std::set<std::string> names;
        for (const auto & t : *tools) {
            if (!t.is_object() || get_string(t, "type", "function") != "function" || !t.contains("function") ||
                !t["function"].is_object()) {
                throw ApiError(400, "each tool must be {\"type\":\"function\",\"function\":{...}}", "tools");
            }
            const auto & f = t["function"];
            common_chat_tool tool;
            tool.name = get_string(f, "name");
            if (tool.name.empty()) throw ApiError(400, "a tool has no name", "tools");
            if (!names.insert(tool.name).second)
                throw ApiError(400, "duplicate tool name '" + tool.name + "'", "tools");
            tool.description = get_string(f, "description");
            const json params = f.contains("parameters") ? f["parameters"] : json{{"type", "object"}};
            check_tool_schema(params, tool.name);
            tool.parameters = dump(params);
            c.tools.push_back(std::move(tool));
        }
    }

    auto tc = body.find("tool_choice");
    if (tc != body.end() && !tc->is_null()) {
        if (tc->is_string()) {
            const auto v = tc->get<std::string>();
            if (v == "auto")
                c.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
            else if (v == "none")
                c.tool_choice = COMMON_CHAT_TOOL_CHOICE_NONE;
            else if (v == "required")
                c.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
            else
                throw ApiError(400, "'tool_choice' must be none, auto, required or a named function", "tool_choice");
        } else if (tc->is_object() && tc->contains("function") && (*tc)["function"].is_object()) {
            c.named_tool = get_string((*tc)["function"], "name");
            c.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
        } else {
            throw ApiError(400, "'tool_choice' must be none, auto, required or a named function", "tool_choice");
        }
        if (c.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && c.tools.empty()) {
            throw ApiError(400, "'tool_choice' requires 'tools'", "tool_choice");
        }
        if (!c.named_tool.empty()) {
            std::erase_if(c.tools, [&](const common_chat_tool & t) { return t.name != c.named_tool; });
            if (c.tools.empty()) throw ApiError(400, "'tool_choice' names an unknown tool", "tool_choice");
        }
    }
    c.parallel_tool_calls = get_bool(body, "parallel_tool_calls", true);
    c.sampling = parse_sampling(body, n_vocab, lim);
    if (!c.tools.empty() && c.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE &&
        (!c.sampling.grammar.empty() || !c.sampling.json_schema.empty())) {
        throw ApiError(400, "'response_format' or 'grammar' cannot be combined with tools", "response_format");
    }
    return c;
}

}  // namespace armada::api

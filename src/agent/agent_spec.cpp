#include "agent/agent_spec.h"

#include "common/json_fields.h"

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <set>

namespace armada::agent {

namespace {

struct SpecError {
    std::string msg;
};

[[noreturn]] void fail(const std::string & where, const std::string & why) {
    throw SpecError{where + ": " + why};
}

bool looks_like_number(const std::string & s) {
    size_t i = s[0] == '-' ? 1 : 0;
    auto digits = [&] {
        const size_t from = i;
        while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])))
            ++i;
        return i > from;
    };
    if (!digits()) return false;
    if (i < s.size() && s[i] == '.' && (++i, !digits())) return false;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
        if (!digits()) return false;
    }
    return i == s.size() && s.size() <= 64;
}

// Set while reading an agent stored by earlier builds, which quoted every scalar: quotes
// then say nothing about the type, so a quoted number is read as a number again.
thread_local bool g_unquote = false;

// YAML aliases can make a node contain itself (`a: &x [*x]`): every walk over a node stops at
// this depth instead of recursing forever.
constexpr int kMaxDepth = 64;

[[noreturn]] void too_deep(const std::string & where) {
    throw SpecError{where + ": is nested deeper than " + std::to_string(kMaxDepth) +
                    " levels (or an alias refers to itself)"};
}

nlohmann::json to_json(const YAML::Node & n, int depth = 0) {
    if (depth > kMaxDepth) too_deep("agent");
    switch (n.Type()) {
        case YAML::NodeType::Map: {
            nlohmann::json j = nlohmann::json::object();
            for (const auto & kv : n) {
                const std::string key = kv.first.as<std::string>();
                // A field named twice would be read one way here and the other way elsewhere.
                if (j.contains(key)) throw SpecError{"agent: the key '" + key + "' appears twice in one map"};
                j[key] = to_json(kv.second, depth + 1);
            }
            return j;
        }
        case YAML::NodeType::Sequence: {
            nlohmann::json j = nlohmann::json::array();
            for (const auto & v : n)
                j.push_back(to_json(v, depth + 1));
            return j;
        }
        case YAML::NodeType::Scalar: {
            const std::string & s = n.Scalar();
            if ((n.Tag() == "!" && !g_unquote) || s.empty()) return s;  // quoted
            if (s == "true") return true;
            if (s == "false") return false;
            if (s == "null" || s == "~") return nullptr;
            // Only what JSON would read as a number becomes one ("nan", "0x10" and "1_000" stay text).
            nlohmann::json num = looks_like_number(s) ? nlohmann::json::parse(s, nullptr, false) : nullptr;
            if (num.is_number()) return num;
            return s;
        }
        default:
            return nullptr;
    }
}

std::string str(const YAML::Node & n, const std::string & where, bool required, const std::string & def = {}) {
    if (!n || n.IsNull()) {
        if (required) fail(where, "is required");
        return def;
    }
    if (!n.IsScalar()) fail(where, "must be a string");
    return n.Scalar();
}

int64_t integer(const YAML::Node & n, const std::string & where, int64_t def, int64_t lo, int64_t hi) {
    if (!n || n.IsNull()) return def;
    int64_t v = 0;
    try {
        v = n.as<int64_t>();
    } catch (...) {
        fail(where, "must be an integer");
    }
    if (v < lo || v > hi) fail(where, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    return v;
}

double number(const YAML::Node & n, const std::string & where, double def, double lo, double hi) {
    if (!n || n.IsNull()) return def;
    double v = 0;
    try {
        v = n.as<double>();
    } catch (...) {
        fail(where, "must be a number");
    }
    if (!(v >= lo && v <= hi)) fail(where, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    return v;
}

void check_keys(const YAML::Node & n, const std::string & where, const std::set<std::string> & allowed) {
    for (const auto & kv : n) {
        const std::string k = kv.first.as<std::string>();
        if (!allowed.count(k)) fail(where + "." + k, "is not a known field");
    }
}

void check_schema(const nlohmann::json & s, const std::string & where) {
    if (!s.is_object()) fail(where, "must be an object (a JSON Schema)");
    if (s.contains("type") && !s["type"].is_string() && !s["type"].is_array())
        fail(where + ".type", "must be a string");
    if (s.contains("type") && s["type"].is_string()) {
        static const std::set<std::string> types = {"object",  "array",   "string", "number",
                                                    "integer", "boolean", "null"};
        if (!types.count(s["type"].get<std::string>())) {
            fail(where + ".type", "'" + s["type"].get<std::string>() + "' is not a JSON Schema type");
        }
    }
    if (s.contains("properties")) {
        if (!s["properties"].is_object()) fail(where + ".properties", "must be an object");
        for (const auto & [k, v] : s["properties"].items())
            check_schema(v, where + ".properties." + k);
    }
    if (s.contains("required")) {
        if (!s["required"].is_array()) fail(where + ".required", "must be a list of property names");
        for (const auto & r : s["required"]) {
            if (!r.is_string()) fail(where + ".required", "must be a list of property names");
        }
    }
    if (s.contains("items")) check_schema(s["items"], where + ".items");
}

bool boolean(const YAML::Node & n, const std::string & where, bool def) {
    if (!n || n.IsNull()) return def;
    try {
        return n.as<bool>();
    } catch (...) {
        fail(where, "must be true or false");
    }
}

// A client's agent is literal text: a secret reference in it would make the server read its
// own environment or files on the client's say-so.
void refuse_secret_references(const YAML::Node & n, const std::string & where, int depth = 0) {
    if (depth > kMaxDepth) too_deep(where);
    if (n.IsScalar()) {
        if (has_secret_reference(n.Scalar())) {
            fail(where,
                 "${env:...} and ${file:...} are expanded only in agent files the operator gives with --agents; "
                 "an agent sent over the API cannot use them (send the value itself)");
        }
    } else if (n.IsMap()) {
        for (const auto & kv : n) {
            const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "?";
            refuse_secret_references(kv.first, where + "." + k, depth + 1);
            refuse_secret_references(kv.second, where + "." + k, depth + 1);
        }
    } else if (n.IsSequence()) {
        for (size_t i = 0; i < n.size(); ++i)
            refuse_secret_references(n[i], where + "[" + std::to_string(i) + "]", depth + 1);
    }
}

HttpToolSpec parse_tool(const YAML::Node & n, const std::string & where) {
    if (!n.IsMap()) fail(where, "must be a map");
    check_keys(n, where,
               {"name", "description", "parameters", "url", "method", "headers", "timeout_ms", "retries", "max_body",
                "follow_redirects"});
    HttpToolSpec t;
    t.name = str(n["name"], where + ".name", true);
    for (char c : t.name) {
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
            fail(where + ".name", "may hold only letters, digits, '_' and '-'");
        }
    }
    t.description = str(n["description"], where + ".description", false);
    nlohmann::json params = n["parameters"] ? to_json(n["parameters"]) : nlohmann::json{{"type", "object"}};
    check_schema(params, where + ".parameters");
    // Bytes that are not UTF-8 become U+FFFD (dump would throw on them).
    t.parameters = common::json_text(params);
    t.url = str(n["url"], where + ".url", true);
    if (t.url.rfind("http://", 0) != 0 && t.url.rfind("https://", 0) != 0)
        fail(where + ".url", "must be http:// or https://");
    t.method = str(n["method"], where + ".method", false, "POST");
    if (t.method != "POST" && t.method != "PUT" && t.method != "GET")
        fail(where + ".method", "must be POST, PUT or GET");
    if (n["headers"]) {
        if (!n["headers"].IsMap()) fail(where + ".headers", "must be a map of header to value");
        for (const auto & kv : n["headers"]) {
            t.headers[kv.first.as<std::string>()] =
                str(kv.second, where + ".headers." + kv.first.as<std::string>(), true);
        }
    }
    t.timeout_ms = int32_t(integer(n["timeout_ms"], where + ".timeout_ms", t.timeout_ms, 1, 600000));
    t.retries = int32_t(integer(n["retries"], where + ".retries", t.retries, 0, 10));
    t.max_body = int32_t(integer(n["max_body"], where + ".max_body", t.max_body, 1, 16 << 20));
    t.follow_redirects = boolean(n["follow_redirects"], where + ".follow_redirects", true);
    return t;
}

McpServerSpec parse_mcp(const YAML::Node & n, const std::string & where) {
    if (!n.IsMap()) fail(where, "must be a map with url and allowed_tools");
    check_keys(n, where, {"url", "allowed_tools", "headers", "timeout_ms", "follow_redirects"});
    McpServerSpec m;
    m.url = str(n["url"], where + ".url", true);
    if (m.url.rfind("http://", 0) != 0 && m.url.rfind("https://", 0) != 0)
        fail(where + ".url", "must be http:// or https://");
    if (n["allowed_tools"]) {
        if (!n["allowed_tools"].IsSequence()) fail(where + ".allowed_tools", "must be a list of tool names");
        for (const auto & t : n["allowed_tools"])
            m.allowed_tools.push_back(str(t, where + ".allowed_tools", true));
    }
    if (n["headers"]) {
        if (!n["headers"].IsMap()) fail(where + ".headers", "must be a map of header to value");
        for (const auto & kv : n["headers"]) {
            m.headers[kv.first.as<std::string>()] = str(kv.second, where + ".headers", true);
        }
    }
    m.timeout_ms = int32_t(integer(n["timeout_ms"], where + ".timeout_ms", m.timeout_ms, 1, 600000));
    m.follow_redirects = boolean(n["follow_redirects"], where + ".follow_redirects", true);
    return m;
}

common_chat_tool_choice parse_choice(const YAML::Node & n, const std::string & where) {
    const std::string v = str(n, where, false, "auto");
    if (v == "auto") return COMMON_CHAT_TOOL_CHOICE_AUTO;
    if (v == "required") return COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    if (v == "none") return COMMON_CHAT_TOOL_CHOICE_NONE;
    fail(where, "must be auto, required or none");
}

AgentSpec parse_agent(const YAML::Node & n, const std::string & where, const ParseOptions & opt) {
    if (!n.IsMap()) fail(where, "must be a map");
    if (!opt.from_operator) refuse_secret_references(n, where);
    const nlohmann::json canonical = to_json(n);  // also refuses a key named twice
    check_keys(n, where,
               {"id", "model", "instructions", "tools", "sampling", "limits", "tool_choice", "min_tool_steps",
                "answer_without_tools", "parallel_tool_calls", "long_after_tools"});
    AgentSpec a;
    a.id = str(n["id"], where + ".id", true);
    if (a.id.empty() || a.id.size() > 64) fail(where + ".id", "must be 1 to 64 characters");
    for (char c : a.id) {
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
            fail(where + ".id", "may hold only letters, digits, '_', '-' and '.'");
        }
    }
    a.model = str(n["model"], where + ".model", false);
    a.instructions = str(n["instructions"], where + ".instructions", false);
    if (n["tools"]) {
        if (!n["tools"].IsSequence()) fail(where + ".tools", "must be a list");
        std::set<std::string> names;
        for (size_t i = 0; i < n["tools"].size(); ++i) {
            const std::string w = where + ".tools[" + std::to_string(i) + "]";
            if (n["tools"][i].IsMap() && n["tools"][i]["mcp"]) {
                a.mcp_servers.push_back(parse_mcp(n["tools"][i]["mcp"], w + ".mcp"));
                continue;
            }
            a.tools.push_back(parse_tool(n["tools"][i], w));
            if (!names.insert(a.tools.back().name).second) fail(w + ".name", "duplicates another tool's name");
        }
    }
    if (const auto s = n["sampling"]) {
        if (!s.IsMap()) fail(where + ".sampling", "must be a map");
        check_keys(s, where + ".sampling", {"temperature", "top_p", "top_k", "min_p", "seed"});
        a.sampling.temperature = float(number(s["temperature"], where + ".sampling.temperature", 0.8, 0, 2));
        a.sampling.top_p = float(number(s["top_p"], where + ".sampling.top_p", 0.95, 0, 1));
        a.sampling.top_k = int32_t(integer(s["top_k"], where + ".sampling.top_k", 40, 0, 1 << 20));
        a.sampling.min_p = float(number(s["min_p"], where + ".sampling.min_p", 0.05, 0, 1));
        if (s["seed"]) a.sampling.seed = uint32_t(integer(s["seed"], where + ".sampling.seed", 0, 0, 0xffffffffLL));
    }
    if (const auto l = n["limits"]) {
        if (!l.IsMap()) fail(where + ".limits", "must be a map");
        check_keys(l, where + ".limits",
                   {"max_steps", "max_tokens_per_step", "token_budget", "tool_timeout_ms", "deadline_s",
                    "max_context_tokens", "max_kv_bytes", "keep_tool_outputs"});
        a.limits.max_steps = int32_t(integer(l["max_steps"], where + ".limits.max_steps", 16, 1, 1000));
        a.limits.max_tokens_per_step =
            int32_t(integer(l["max_tokens_per_step"], where + ".limits.max_tokens_per_step", 512, 1, 1 << 20));
        a.limits.token_budget = integer(l["token_budget"], where + ".limits.token_budget", 0, 0, int64_t(1) << 40);
        a.limits.tool_timeout_ms =
            int32_t(integer(l["tool_timeout_ms"], where + ".limits.tool_timeout_ms", 30000, 1, 3600000));
        a.limits.deadline_s = int32_t(integer(l["deadline_s"], where + ".limits.deadline_s", 0, 0, 30 * 86400));
        a.limits.max_context_tokens =
            int32_t(integer(l["max_context_tokens"], where + ".limits.max_context_tokens", 0, 0, 1 << 24));
        a.limits.max_kv_bytes = integer(l["max_kv_bytes"], where + ".limits.max_kv_bytes", 0, 0, int64_t(1) << 44);
        a.limits.keep_tool_outputs =
            int32_t(integer(l["keep_tool_outputs"], where + ".limits.keep_tool_outputs", -1, -1, 100000));
    }
    a.tool_choice = parse_choice(n["tool_choice"], where + ".tool_choice");
    a.min_tool_steps = int32_t(integer(n["min_tool_steps"], where + ".min_tool_steps", 0, 0, 1000));
    const bool any_tools = !a.tools.empty() || !a.mcp_servers.empty();
    if (a.min_tool_steps > 0 && !any_tools) fail(where + ".min_tool_steps", "needs at least one tool");
    if (a.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && !any_tools) fail(where + ".tool_choice", "needs tools");
    a.parallel_tool_calls = boolean(n["parallel_tool_calls"], where + ".parallel_tool_calls", true);
    a.answer_without_tools = boolean(n["answer_without_tools"], where + ".answer_without_tools", false);
    if (const auto l = n["long_after_tools"]) {
        if (!l.IsSequence()) fail(where + ".long_after_tools", "must be a list of tool names");
        for (size_t i = 0; i < l.size(); ++i) {
            const std::string w = where + ".long_after_tools[" + std::to_string(i) + "]";
            const std::string name = str(l[i], w, true);
            const bool known =
                std::any_of(a.tools.begin(), a.tools.end(), [&](const auto & t) { return t.name == name; });
            // MCP tools are known only once imported; HTTP ones must be this agent's.
            if (!known && a.mcp_servers.empty()) fail(w, "'" + name + "' is not a tool of this agent");
            a.long_after_tools.push_back(name);
        }
    }
    a.from_operator = opt.from_operator;
    for (auto & t : a.tools)
        t.expand_secrets = opt.from_operator;
    for (auto & m : a.mcp_servers)
        m.expand_secrets = opt.from_operator;
    a.source = common::json_text(canonical);
    return a;
}

}  // namespace

bool has_secret_reference(const std::string & value) {
    return value.find("${env:") != std::string::npos || value.find("${file:") != std::string::npos;
}

std::string parse_agents(const std::string & text, std::vector<AgentSpec> & out, const ParseOptions & opt) {
    struct Unquote {
        explicit Unquote(bool on) { g_unquote = on; }
        ~Unquote() { g_unquote = false; }
    } unquote(opt.legacy_quoted);
    try {
        YAML::Node root = YAML::Load(text);
        YAML::Node list = root;
        std::string base = "agents";
        if (root.IsMap() && root["agents"])
            list = root["agents"];
        else if (root.IsMap()) {
            // A single agent given on its own, as POST /v1/agents sends it.
            out.push_back(parse_agent(root, "agent", opt));
            return {};
        }
        if (!list.IsSequence()) return "agents: must be a list of agents";
        std::set<std::string> ids;
        for (size_t i = 0; i < list.size(); ++i) {
            const std::string w = base + "[" + std::to_string(i) + "]";
            out.push_back(parse_agent(list[i], w, opt));
            if (!ids.insert(out.back().id).second) return w + ".id: duplicates another agent's id";
        }
    } catch (const SpecError & e) {
        return e.msg;
    } catch (const YAML::Exception & e) {
        return std::string("not valid YAML: ") + e.what();
    }
    return {};
}

}  // namespace armada::agent

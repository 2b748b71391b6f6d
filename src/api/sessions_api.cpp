#include "api/sessions_api.h"

#include <yaml-cpp/yaml.h>

#include "api/errors.h"
#include "api/sse.h"

#include <cstdio>

namespace armada::api {

std::string owner_of(const std::string & api_key) {
    if (api_key.empty()) return {};
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (unsigned char c : api_key) {
        h ^= c;
        h *= 1099511628211ULL;
    }
    char buf[17];
    snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

namespace {

void reply(const std::shared_ptr<Responder> & out, const agent::Outcome & o, json ok_body) {
    if (o.status != 200) {
        Headers h;
        if (o.retry_after_s > 0) h.emplace_back("Retry-After", std::to_string(o.retry_after_s));
        out->send(o.status, "application/json", error_body(o.status, o.error), std::move(h));
        return;
    }
    out->send(200, "application/json", dump(ok_body));
}

json memory_json(const agent::SessionView & v) {
    json hist = json::array();
    for (const auto & p : v.kv_history)
        hist.push_back({{"step", p.step}, {"kv_tokens", p.tokens}, {"kv_bytes", p.bytes}});
    json m = {{"kv_tokens", v.kv ? v.kv->tokens : 0},
              {"kv_bytes", v.kv ? v.kv->bytes : 0},
              {"kv_location", v.kv ? json(v.kv->where) : json(nullptr)},
              {"kv_engine", v.kv ? json(v.kv->engine) : json(nullptr)},
              {"compactions", v.compactions},
              {"history", hist}};
    return m;
}

json view_json(const agent::SessionView & v) {
    json steps = json::array();
    for (const auto & s : v.steps) {
        json p = json::parse(s.payload, nullptr, false);
        json e = {
            {"seq", s.seq}, {"kind", s.kind}, {"data", p.is_discarded() ? json(s.payload) : p}, {"ts_ms", s.ts_ms}};
        if (!s.idempotency.empty()) e["idempotency_key"] = s.idempotency;
        steps.push_back(e);
    }
    return {{"id", v.id},
            {"object", "session"},
            {"agent_id", v.agent_id},
            {"state", v.state},
            {"reason", v.reason.empty() ? json(nullptr) : json(v.reason)},
            {"created_at", v.created_ms / 1000},
            {"transcript", json::parse(v.transcript)},
            {"steps", steps},
            {"usage",
             {{"model_steps", v.model_steps},
              {"prompt_tokens", v.prompt_tokens},
              {"completion_tokens", v.completion_tokens},
              {"total_tokens", v.prompt_tokens + v.completion_tokens}}},
            {"memory", memory_json(v)}};
}

std::string text_input(const json & body) {
    for (const char * k : {"input", "content"}) {
        if (body.contains(k) && !body[k].is_null()) {
            if (!body[k].is_string()) throw ApiError(400, std::string("'") + k + "' must be a string", k);
            return body[k].get<std::string>();
        }
    }
    return {};
}

std::vector<std::string> split(const std::string & path) {
    std::vector<std::string> parts;
    size_t i = 1;
    while (i <= path.size()) {
        size_t j = path.find('/', i);
        if (j == std::string::npos) j = path.size();
        parts.push_back(path.substr(i, j - i));
        i = j + 1;
    }
    return parts;
}

}  // namespace

bool SessionsApi::handle(const HttpRequest & req, const std::string & owner, const std::shared_ptr<Responder> & out,
                         std::string & route_name) {
    const auto p = split(req.path);
    if (p.size() < 2 || p[0] != "v1" || (p[1] != "agents" && p[1] != "sessions")) return false;
    const std::string & m = req.method;
    if (p[1] == "agents" && p.size() == 2) {
        route_name = "/v1/agents";
        if (m == "GET") {
            json list = json::array();
            for (const auto & a : mgr_.agents()) {
                json tools = json::array();
                for (const auto & t : a.tools)
                    tools.push_back(t.name);
                list.push_back({{"id", a.id}, {"object", "agent"}, {"tools", tools}});
            }
            out->send(200, "application/json", dump(json{{"object", "list"}, {"data", list}}));
            return true;
        }
        if (m != "POST") throw ApiError(405, "use GET or POST for /v1/agents");
        std::vector<agent::AgentSpec> specs;
        const std::string err = agent::parse_agents(req.body, specs);
        if (!err.empty()) throw ApiError(400, "invalid agent: " + err);
        for (auto & s : specs) {
            if (prepare_) {
                if (auto e = prepare_(s); !e.empty()) throw ApiError(400, "agent '" + s.id + "': " + e);
            }
        }
        // Each agent is stored with its own source text, so it is declared again after a restart.
        const YAML::Node root = YAML::Load(req.body);
        YAML::Node list(YAML::NodeType::Sequence);
        if (root.IsSequence()) {
            list = root;
        } else if (root.IsMap() && root["agents"] && root["agents"].IsSequence()) {
            list = root["agents"];
        } else {
            list.push_back(root);  // one agent, as a map
        }
        auto left = std::make_shared<size_t>(specs.size());
        auto failed = std::make_shared<std::string>();
        const std::string first = specs.empty() ? "" : specs[0].id;
        if (specs.empty()) {
            out->send(200, "application/json", dump(json{{"id", first}, {"object", "agent"}}));
            return true;
        }
        for (size_t i = 0; i < specs.size(); ++i) {
            YAML::Node one(YAML::NodeType::Sequence);
            one.push_back(list[i]);
            YAML::Emitter em;
            em << YAML::DoubleQuoted << one;
            mgr_.declare_agent(specs[i], em.c_str(), [out, left, failed, first](agent::Outcome o) {
                if (o.status != 200 && failed->empty()) *failed = o.error;
                if (--*left > 0) return;
                if (!failed->empty()) {
                    out->send(503, "application/json", error_body(503, *failed));
                } else {
                    out->send(200, "application/json", dump(json{{"id", first}, {"object", "agent"}}));
                }
            });
        }
        return true;
    }
    if (p[1] == "agents" && p.size() == 4 && p[3] == "sessions") {
        route_name = "/v1/agents/{id}/sessions";
        if (m != "POST") throw ApiError(405, "use POST to create a session");
        const json body = req.body.empty() ? json::object() : parse_request_body(req.body);
        mgr_.create(p[2], owner, text_input(body), [out](agent::Outcome o) {
            reply(out, o, json{{"id", o.id}, {"object", "session"}});
        });
        return true;
    }
    if (p[1] != "sessions" || p.size() < 3) throw ApiError(404, "no route for " + m + " " + req.path);
    const std::string & id = p[2];
    if (p.size() == 3) {
        route_name = "/v1/sessions/{id}";
        if (m == "GET") {
            auto v = mgr_.get(id, owner);
            if (!v) throw ApiError(404, "no session with id '" + id + "'");
            out->send(200, "application/json", dump(view_json(*v)));
            return true;
        }
        if (m == "DELETE") {
            mgr_.erase(id, owner, [out](agent::Outcome o) {
                reply(out, o, json{{"id", o.id}, {"object", "session"}, {"deleted", true}});
            });
            return true;
        }
        throw ApiError(405, "use GET or DELETE for a session");
    }
    if (p.size() == 4 && p[3] == "messages") {
        route_name = "/v1/sessions/{id}/messages";
        if (m != "POST") throw ApiError(405, "use POST to add a message");
        const json body = parse_request_body(req.body);
        mgr_.add_message(id, owner, text_input(body), [out](agent::Outcome o) {
            reply(out, o, json{{"id", o.id}, {"object", "session"}});
        });
        return true;
    }
    if (p.size() == 4 && p[3] == "cancel") {
        route_name = "/v1/sessions/{id}/cancel";
        if (m != "POST") throw ApiError(405, "use POST to cancel");
        mgr_.cancel(id, owner, [out](agent::Outcome o) { reply(out, o, json{{"id", o.id}, {"state", "cancelled"}}); });
        return true;
    }
    if (p.size() == 4 && p[3] == "events") {
        route_name = "/v1/sessions/{id}/events";
        if (m != "GET") throw ApiError(405, "use GET for events");
        events(id, owner, req, out);
        return true;
    }
    throw ApiError(404, "no route for " + m + " " + req.path);
}

void SessionsApi::events(const std::string & id, const std::string & owner, const HttpRequest & req,
                         const std::shared_ptr<Responder> & out) {
    int64_t last = 0;
    std::string from = req.header("last-event-id");
    if (from.empty() && req.query.rfind("last_event_id=", 0) == 0) from = req.query.substr(14);
    if (!from.empty()) {
        try {
            last = std::stoll(from);
        } catch (...) {
            throw ApiError(400, "Last-Event-ID must be a number");
        }
    }
    if (!mgr_.get(id, owner)) throw ApiError(404, "no session with id '" + id + "'");
    out->start_stream(200);
    const uint64_t h = mgr_.subscribe(
        id, owner, last,
        [out](const agent::SessionEventRecord & ev) { out->write(sse_event(ev.type, ev.data, uint64_t(ev.id))); },
        [out] { out->end(); });
    out->on_close([this, id, h] { mgr_.unsubscribe(id, h); });
}

}  // namespace armada::api

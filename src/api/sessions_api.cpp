#include "api/sessions_api.h"

#include "api/errors.h"
#include "net/sse.h"

#include <cstdlib>
#include <mutex>

namespace armada::api {

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
    json j = {{"id", v.id},
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
    if (!v.node.empty()) {
        // Where it ran: each move between nodes, with how its KV came along.
        json moves = json::array();
        for (const auto & s : v.steps) {
            if (s.kind != "moved") continue;
            json p = json::parse(s.payload, nullptr, false);
            if (!p.is_object()) continue;
            p["seq"] = s.seq;
            p["at"] = s.ts_ms;
            moves.push_back(std::move(p));
        }
        j["placement"] = {{"node", v.node}, {"epoch", v.epoch}, {"moves", moves}};
    }
    return j;
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

ApiError agent_not_found(const std::string & id) {
    return ApiError(404, "no agent with id '" + id + "'", {}, "not_found");
}

// The tenant an agents route acts for: the caller's, or (admin only) `?tenant=NAME`.
std::string acting_tenant(const HttpRequest & req, const Caller & caller) {
    const std::string named = req.param("tenant");
    if (named.empty()) return caller.tenant;
    if (!caller.admin) throw ApiError(403, "only an admin key may act for another tenant (?tenant=)", "tenant");
    return tenant_id(named);
}

}  // namespace

json agent_json(const agent::AgentSpec & a, bool with_spec, bool with_source) {
    // The list names the tools; one agent's page has their schemas too.
    json tools = json::array();
    for (const auto & t : a.tools) {
        if (!with_spec) {
            tools.push_back(t.name);
            continue;
        }
        json tj = {{"name", t.name},
                   {"description", t.description},
                   {"parameters", json::parse(t.parameters, nullptr, false)}};
        if (!t.mcp_url.empty() && with_source) tj["mcp_server"] = t.mcp_url;
        tools.push_back(tj);
    }
    const std::string owner = a.from_operator                    ? "operator"
                              : a.tenant == agent::kSharedTenant ? "shared"
                                                                 : tenant_name(a.tenant);
    json j = {{"id", a.id}, {"object", "agent"}, {"owner", owner}, {"tools", tools}};
    if (with_spec && with_source) j["spec"] = json::parse(a.source, nullptr, false);
    return j;
}

bool SessionsApi::handle(const HttpRequest & req, const Caller & caller, const std::shared_ptr<Responder> & out,
                         std::string & route_name) {
    const auto p = split(req.path);
    if (p.size() < 2 || p[0] != "v1" || (p[1] != "agents" && p[1] != "sessions")) return false;
    const std::string & m = req.method;
    if (p[1] == "agents" && p.size() == 2) {
        route_name = "/v1/agents";
        if (m == "GET") {
            const bool all = caller.admin && req.param("tenant").empty();
            const std::string tenant = acting_tenant(req, caller);
            json list = json::array();
            for (const auto & a : mgr_.agents(tenant, all))
                list.push_back(agent_json(a, false, false));
            out->send(200, "application/json", dump(json{{"object", "list"}, {"data", list}}));
            return true;
        }
        if (m != "POST") throw ApiError(405, "use GET or POST for /v1/agents");
        declare(req, acting_tenant(req, caller), out);
        return true;
    }
    if (p[1] == "agents" && p.size() == 3) {
        route_name = "/v1/agents/{id}";
        const std::string tenant = acting_tenant(req, caller);
        const std::string & id = p[2];
        auto a = mgr_.agent(tenant, id);
        if (!a) throw agent_not_found(id);
        if (m == "GET") {
            // The operator's file is the operator's: its URLs and literal values are shown to
            // admins only; everyone sees the tools' names and schemas.
            out->send(200, "application/json", dump(agent_json(*a, true, !a->from_operator || caller.admin)));
            return true;
        }
        if (m == "DELETE") {
            const bool shared = a->tenant == agent::kSharedTenant && !a->from_operator;
            if (shared && !caller.admin) {
                throw ApiError(403, "agent '" + id + "' is shared by every tenant; only an admin key may delete it");
            }
            mgr_.delete_agent(shared ? a->tenant : tenant, id, [out](agent::Outcome o) {
                reply(out, o, json{{"id", o.id}, {"object", "agent"}, {"deleted", true}});
            });
            return true;
        }
        throw ApiError(405, "use GET or DELETE for an agent; POST /v1/agents replaces one");
    }
    if (p[1] == "agents" && p.size() == 4 && p[3] == "sessions") {
        route_name = "/v1/agents/{id}/sessions";
        if (m != "POST") throw ApiError(405, "use POST to create a session");
        const json body = req.body.empty() ? json::object() : parse_request_body(req.body);
        mgr_.create(
            p[2], caller.tenant, text_input(body),
            [out](agent::Outcome o) {
                reply(out, o, json{{"id", o.id}, {"object", "session"}});
            },
            obs::TraceContext::parse(req.header("traceparent")));
        return true;
    }
    if (p[1] == "sessions" && p.size() == 2) {
        route_name = "/v1/sessions";
        if (m != "GET") throw ApiError(405, "use GET to list sessions; POST /v1/agents/{id}/sessions creates one");
        const std::string state = req.param("state");
        if (!state.empty() && !agent::parse_state(state))
            throw ApiError(400,
                           "state must be one of queued, running, waiting_tool, waiting_input, completed, failed, "
                           "cancelled");
        size_t limit = 100;
        if (const std::string l = req.param("limit"); !l.empty()) {
            char * end = nullptr;
            const long v = std::strtol(l.c_str(), &end, 10);
            if (!end || *end || v < 1 || v > 1000) throw ApiError(400, "limit must be a whole number from 1 to 1000");
            limit = size_t(v);
        }
        auto rows = mgr_.list(caller.tenant, state, limit);
        if (!rows) throw ApiError(503, "the session store cannot be read; retry shortly");
        json list = json::array();
        for (const auto & r : *rows) {
            json s = {{"id", r.id},
                      {"object", "session"},
                      {"agent", r.agent_id},
                      {"state", r.state},
                      {"created_at", r.created_ms / 1000},
                      {"updated_at", r.updated_ms / 1000}};
            if (!r.reason.empty()) s["reason"] = r.reason;
            if (!r.cell.empty()) s["cell"] = r.cell;
            if (!r.node.empty()) s["node"] = r.node;
            list.push_back(std::move(s));
        }
        out->send(200, "application/json", dump(json{{"object", "list"}, {"data", list}}));
        return true;
    }
    if (p[1] != "sessions" || p.size() < 3) throw ApiError(404, "no route for " + m + " " + req.path);
    const std::string & id = p[2];
    if (p.size() == 3) {
        route_name = "/v1/sessions/{id}";
        if (m == "GET") {
            auto v = mgr_.get(id, caller.tenant);
            if (!v) throw ApiError(404, "no session with id '" + id + "'");
            out->send(200, "application/json", dump(view_json(*v)));
            return true;
        }
        if (m == "DELETE") {
            mgr_.erase(id, caller.tenant, [out](agent::Outcome o) {
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
        mgr_.add_message(
            id, caller.tenant, text_input(body),
            [out](agent::Outcome o) {
                reply(out, o, json{{"id", o.id}, {"object", "session"}});
            },
            obs::TraceContext::parse(req.header("traceparent")));
        return true;
    }
    if (p.size() == 4 && p[3] == "cancel") {
        route_name = "/v1/sessions/{id}/cancel";
        if (m != "POST") throw ApiError(405, "use POST to cancel");
        mgr_.cancel(id, caller.tenant, [out](agent::Outcome o) {
            reply(out, o, json{{"id", o.id}, {"state", "cancelled"}});
        });
        return true;
    }
    if (p.size() == 4 && p[3] == "events") {
        route_name = "/v1/sessions/{id}/events";
        if (m != "GET") throw ApiError(405, "use GET for events");
        events(id, caller.tenant, req, out);
        return true;
    }
    throw ApiError(404, "no route for " + m + " " + req.path);
}

void SessionsApi::declare(const HttpRequest & req, const std::string & tenant, const std::shared_ptr<Responder> & out) {
    std::vector<agent::AgentSpec> specs;
    // A client's agent is literal: secret references are refused, never expanded.
    const std::string err = agent::parse_agents(req.body, specs, {.from_operator = false});
    if (!err.empty()) throw ApiError(400, "invalid agent: " + err);
    if (specs.empty()) throw ApiError(400, "invalid agent: the body declares no agent");
    for (const auto & s : specs) {
        if (mgr_.is_operator_agent(s.id)) {
            throw ApiError(403,
                           "agent '" + s.id + "' is declared by the operator (--agents) and is read-only over the API");
        }
    }
    // Each agent is completed (its MCP servers asked for their tools) off the I/O threads, then
    // stored as its canonical JSON, so it is declared again, unchanged, after a restart.
    struct Pending {
        size_t left = 0;
        int status = 200;
        std::string error;
    };
    auto st = std::make_shared<Pending>();
    auto mu = std::make_shared<std::mutex>();
    st->left = specs.size();
    const std::string first = specs[0].id;
    auto finish_one = [out, st, mu, first](int status, const std::string & error) {
        std::lock_guard lk(*mu);
        if (status != 200 && st->status == 200) {
            st->status = status;
            st->error = error;
        }
        if (--st->left > 0) return;
        if (st->status != 200) {
            Headers h;
            if (st->status == 429 || st->status == 503) h.emplace_back("Retry-After", "1");
            out->send(st->status, "application/json", error_body(st->status, st->error), h);
        } else {
            out->send(200, "application/json", dump(json{{"id", first}, {"object", "agent"}}));
        }
    };
    for (auto & s : specs) {
        auto store = [this, tenant, finish_one](std::string e, agent::AgentSpec done) {
            if (!e.empty()) return finish_one(400, "agent '" + done.id + "': " + e);
            mgr_.declare_agent(std::move(done), tenant,
                               [finish_one](agent::Outcome o) { finish_one(o.status, o.error); });
        };
        if (!prepare_ || s.mcp_servers.empty()) {
            store({}, std::move(s));
            continue;
        }
        const std::string id = s.id;
        if (!prepare_(std::move(s), tenant, store)) {
            finish_one(
                429, "agent '" + id + "': too many calls to MCP servers are in flight for this tenant; retry shortly");
        }
    }
}

void SessionsApi::events(const std::string & id, const std::string & tenant, const HttpRequest & req,
                         const std::shared_ptr<Responder> & out) {
    std::string from = req.header("last-event-id");
    if (from.empty()) from = req.param("last_event_id");
    agent::EventId after;
    if (!from.empty()) {
        auto parsed = agent::EventId::parse(from);
        if (!parsed) throw ApiError(400, "Last-Event-ID must be an event id such as 12 or 12.3", "Last-Event-ID");
        after = *parsed;
    }
    if (!mgr_.get(id, tenant)) throw ApiError(404, "no session with id '" + id + "'");
    if (auto held = mgr_.held_elsewhere(id, tenant)) return reply(out, *held, {});
    out->start_stream(200);
    out->long_lived();
    const uint64_t h = mgr_.subscribe(
        id, tenant, after,
        [out](const agent::SessionEventRecord & ev) { out->write(net::sse_event(ev.type, ev.data, ev.id.text())); },
        [out] { out->end(); });
    if (h == 0) return out->end();  // gone meanwhile, or another live node holds it
    out->on_close([this, id, h] { mgr_.unsubscribe(id, h); });
}

}  // namespace armada::api

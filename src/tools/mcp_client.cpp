#include "tools/mcp_client.h"

#include "tools/charset.h"
#include "tools/http_sync.h"
#include "tools/http_tool.h"
#include "tools/mcp_messages.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <set>
#include <sstream>

namespace armada::tools {

using json = nlohmann::json;

namespace {
constexpr const char * kStateless = "2026-07-28";
constexpr const char * kSession = "2025-11-25";
// The trace context of the tool call this thread is making (a call runs on one worker thread,
// from its first request to its last): each request of the call carries it.
thread_local std::string t_traceparent;

}  // namespace

json McpClient::post(const std::string & method, const json & msg, bool stateless, std::string & err, int & status,
                     const std::string & name, const Deadline & dl) {
    std::vector<std::pair<std::string, std::string>> headers = {{"Content-Type", "application/json"},
                                                                {"Accept", "application/json, text/event-stream"}};
    std::string version, session;
    {
        std::lock_guard lk(mu_);
        version = version_;
        session = session_id_;
    }
    if (!t_traceparent.empty()) headers.emplace_back("traceparent", t_traceparent);
    if (stateless) {
        headers.emplace_back("MCP-Protocol-Version", kStateless);
        headers.emplace_back("Mcp-Method", method);
        if (!name.empty()) headers.emplace_back("Mcp-Name", name);
    } else {
        if (!version.empty()) headers.emplace_back("MCP-Protocol-Version", version);
        if (!session.empty()) headers.emplace_back("MCP-Session-Id", session);
    }
    for (const auto & [k, v] : spec_.headers) {
        // Only the operator's agents name secrets; a client's headers are sent as written.
        std::string resolved = v;
        if (spec_.expand_secrets && !resolve_secret(v, resolved, err)) return json();
        headers.emplace_back(k, resolved);
    }
    const int timeout = request_timeout_ms(dl);
    if (timeout <= 0) {
        err = "no answer within the time allowed";
        return json();
    }
    HttpOptions o;
    o.timeout_ms = timeout;
    o.max_body = 8 << 20;
    o.follow_redirects = spec_.follow_redirects;
    o.sensitive = names_of(spec_.headers);
    o.tls = tls_;
    const HttpReply r = http_request("POST", spec_.url, headers, msg.dump(), o, guard_);
    status = r.status;
    spdlog::debug("mcp {} {}: HTTP {} {} ({} bytes) {}", spec_.url, method, r.status, r.error, r.body.size(),
                  r.body.substr(0, 300));
    if (!r.error.empty()) {
        err = r.error;
        return json();
    }
    if (r.status >= 300 && r.status < 400) {
        auto loc = r.headers.find("location");
        err = "the server answered HTTP " + std::to_string(r.status) +
              (loc == r.headers.end() ? std::string() : " (a redirect to " + loc->second + ")") +
              (spec_.follow_redirects ? "" : ", and its follow_redirects is false");
        return json();
    }
    if (!stateless && method == "initialize") {
        auto it = r.headers.find("mcp-session-id");
        std::lock_guard lk(mu_);
        session_id_ = it == r.headers.end() ? "" : it->second;
    }
    if (r.status == 202 || !msg.contains("id")) return json::object();  // a notification
    auto ct = r.headers.find("content-type");
    return mcp_answer(r.status, r.body, ct == r.headers.end() ? "" : ct->second, msg["id"], err);
}

bool McpClient::initialize(std::string & err, const Deadline & dl) {
    json msg = {{"jsonrpc", "2.0"},
                {"id", 0},
                {"method", "initialize"},
                {"params",
                 {{"protocolVersion", kSession},
                  {"capabilities", json::object()},
                  {"clientInfo", {{"name", "armada"}, {"version", ARMADA_VERSION}}}}}};
    {
        std::lock_guard lk(mu_);
        msg["id"] = next_id_++;
        session_id_.clear();
        version_.clear();
    }
    int status = 0;
    json res = post("initialize", msg, false, err, status, {}, dl);
    const std::string version = mcp_protocol_version(res);
    if (version.empty()) {
        if (err.empty()) err = "initialize returned no protocolVersion";
        return false;
    }
    {
        std::lock_guard lk(mu_);
        version_ = version;
        stateless_ = false;
    }
    post("notifications/initialized", json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}, false, err,
         status, {}, dl);
    err.clear();
    return true;
}

bool McpClient::ready(std::string & err, const Deadline & dl) {
    {
        std::lock_guard lk(mu_);
        if (!version_.empty()) return true;
    }
    // Prefer the stateless revision; a server that does not know server/discover answers with an
    // error, and the session protocol takes over.
    json msg = {{"jsonrpc", "2.0"},
                {"method", "server/discover"},
                {"params",
                 {{"_meta",
                   {{"io.modelcontextprotocol/protocolVersion", kStateless},
                    {"io.modelcontextprotocol/clientCapabilities", json::object()},
                    {"io.modelcontextprotocol/clientInfo", {{"name", "armada"}, {"version", ARMADA_VERSION}}}}}}}};
    {
        std::lock_guard lk(mu_);
        msg["id"] = next_id_++;
    }
    int status = 0;
    std::string derr;
    json res = post("server/discover", msg, true, derr, status, {}, dl);
    if (res.is_object() && res.contains("supportedVersions") && res["supportedVersions"].is_array()) {
        for (const auto & v : res["supportedVersions"]) {
            if (v == kStateless) {
                std::lock_guard lk(mu_);
                version_ = kStateless;
                stateless_ = true;
                return true;
            }
        }
    }
    return initialize(err, dl);
}

json McpClient::rpc(const std::string & method, json params, std::string & err, const Deadline & dl,
                    const std::string & name) {
    for (int attempt = 0; attempt < 2; ++attempt) {
        err.clear();
        if (!ready(err, dl)) return json();
        bool stateless;
        bool had_session;
        json msg = {{"jsonrpc", "2.0"}, {"method", method}};
        {
            std::lock_guard lk(mu_);
            stateless = stateless_;
            had_session = !session_id_.empty();
            msg["id"] = next_id_++;
        }
        if (stateless) {
            params["_meta"]["io.modelcontextprotocol/protocolVersion"] = kStateless;
            params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json::object();
        }
        msg["params"] = params;
        int status = 0;
        json res = post(method, msg, stateless, err, status, name, dl);
        // The spec answers an expired session with 404; some servers (the reference one among
        // them) say 400 "no valid session". Either way: initialize again, then retry once.
        if (!stateless && had_session && (status == 404 || status == 400)) {
            std::lock_guard lk(mu_);
            version_.clear();
            session_id_.clear();
            continue;
        }
        return res;
    }
    return json();
}

std::string McpClient::protocol() {
    std::lock_guard lk(mu_);
    return version_;
}

int McpClient::request_timeout_ms(const Deadline & dl) const {
    if (!dl) return spec_.timeout_ms;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*dl - std::chrono::steady_clock::now());
    return int(std::min<int64_t>(spec_.timeout_ms, left.count()));
}

std::string McpClient::list_tools(std::vector<HttpToolSpec> & out, const std::vector<std::string> & only,
                                  int budget_ms) {
    // The deadline belongs to this call: other calls on the same client keep their own.
    Deadline dl;
    if (budget_ms > 0) dl = std::chrono::steady_clock::now() + std::chrono::milliseconds(budget_ms);
    std::string cursor, err;
    std::set<std::string> allowed(only.begin(), only.end());
    for (int page = 0; page < 100; ++page) {
        json params = json::object();
        if (!cursor.empty()) params["cursor"] = cursor;
        json res = rpc("tools/list", params, err, dl);
        if (!err.empty()) return "MCP server " + spec_.url + ": tools/list failed: " + err;
        const size_t first = out.size();
        mcp_tools_page(res, allowed, out, cursor);
        for (size_t i = first; i < out.size(); ++i) {
            out[i].url = spec_.url;
            out[i].mcp_url = spec_.url;
            out[i].timeout_ms = spec_.timeout_ms;
            out[i].headers = spec_.headers;
            out[i].expand_secrets = spec_.expand_secrets;
            out[i].follow_redirects = spec_.follow_redirects;
        }
        if (cursor.empty()) return {};
    }
    return "MCP server " + spec_.url + ": tools/list did not end after 100 pages";
}

ToolResult McpClient::call_tool(const std::string & name, const std::string & arguments, const std::string & key,
                                const std::string & traceparent) {
    struct Scope {
        explicit Scope(const std::string & tp) { t_traceparent = tp; }
        ~Scope() { t_traceparent.clear(); }
        Scope(const Scope &) = delete;
        Scope & operator=(const Scope &) = delete;
    } scope(traceparent);
    const auto t0 = std::chrono::steady_clock::now();
    ToolResult r;
    r.attempts = 1;
    json args = json::parse(arguments, nullptr, false);
    if (!args.is_object()) args = json::object();
    json params = {{"name", name}, {"arguments", args}, {"_meta", {{"io.armada/idempotencyKey", key}}}};
    std::string err;
    json res = rpc("tools/call", params, err, std::nullopt, name);
    r.latency_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!err.empty()) {
        r.is_error = true;
        r.content = "tool error: " + err;
        return r;
    }
    ToolResult out = mcp_call_result(res);
    out.attempts = r.attempts;
    out.latency_s = r.latency_s;
    return out;
}

std::string import_mcp_tools(const std::vector<McpServerSpec> & servers, std::vector<HttpToolSpec> & tools,
                             const SsrfGuard & guard, boost::asio::ssl::context * tls, int budget_ms) {
    std::set<std::string> names;
    for (const auto & t : tools)
        names.insert(t.name);
    for (const auto & m : servers) {
        McpClient c(m, guard, tls);
        std::vector<HttpToolSpec> listed;
        if (auto err = c.list_tools(listed, m.allowed_tools, budget_ms); !err.empty()) return err;
        for (auto & t : listed) {
            if (!names.insert(t.name).second)
                return "MCP server " + m.url + ": tool '" + t.name + "' clashes with another tool";
            tools.push_back(std::move(t));
        }
    }
    return {};
}

std::shared_ptr<McpClient> McpClients::get(const std::string & tenant, const McpServerSpec & in) {
    // Which tools a caller wants is its own business (list_tools takes it); the client is the
    // connection and the MCP session, shared by calls of one tenant and one header set.
    McpServerSpec spec = in;
    spec.allowed_tools.clear();
    std::string key = tenant + '\n' + spec.url + '\n' + (spec.expand_secrets ? "1" : "0") +
                      (spec.follow_redirects ? "1" : "0") + std::to_string(spec.timeout_ms);
    for (const auto & [k, v] : spec.headers)
        key += '\n' + k + '\n' + v;
    std::lock_guard lk(mu_);
    auto it = clients_.find(key);
    if (it != clients_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.second);
        return it->second.first;
    }
    lru_.push_front(key);
    auto c = std::make_shared<McpClient>(spec, guard_, tls_);
    clients_[key] = {c, lru_.begin()};
    while (clients_.size() > capacity_) {
        clients_.erase(lru_.back());
        lru_.pop_back();
    }
    return c;
}

size_t McpClients::size() const {
    std::lock_guard lk(mu_);
    return clients_.size();
}

void RoutingTransport::call(const HttpToolSpec & spec, const ToolCall & call, std::function<void(ToolResult)> done) {
    if (spec.mcp_url.empty()) {
        auto shared_done = std::make_shared<std::function<void(ToolResult)>>(std::move(done));
        const bool ok = gate_.enter(call.tenant, [this, spec, call, shared_done](TenantGate::Release release) {
            http_.call(spec, call, [shared_done, release](ToolResult r) {
                release();
                (*shared_done)(std::move(r));
            });
        });
        if (!ok) {
            ToolResult r;
            r.is_error = true;
            r.content = "tool error: too many tool calls are waiting for this tenant; try again later";
            (*shared_done)(std::move(r));
        }
        return;
    }
    McpServerSpec m;
    m.url = spec.mcp_url;
    m.headers = spec.headers;
    m.expand_secrets = spec.expand_secrets;
    m.follow_redirects = spec.follow_redirects;
    m.timeout_ms = spec.timeout_ms;
    auto c = clients_.get(call.tenant, m);
    auto shared_done = std::make_shared<std::function<void(ToolResult)>>(std::move(done));
    const bool queued = calls_.run(call.tenant, [c, call, shared_done] {
        (*shared_done)(c->call_tool(call.name, call.arguments, call.idempotency_key, call.traceparent));
    });
    if (!queued) {
        ToolResult r;
        r.is_error = true;
        r.content = "tool error: too many MCP calls are waiting for this tenant; try again later";
        (*shared_done)(std::move(r));
    }
}

}  // namespace armada::tools

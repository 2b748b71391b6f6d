#include "tools/mcp_client.h"

#include "tools/charset.h"
#include "tools/http_sync.h"
#include "tools/http_tool.h"
#include "tools/mcp_messages.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include <chrono>
#include <set>
#include <sstream>

namespace armada::tools {

using json = nlohmann::json;

namespace {
constexpr const char * kStateless = "2026-07-28";
constexpr const char * kSession = "2025-11-25";

}  // namespace

json McpClient::post(const std::string & method, const json & msg, bool stateless, std::string & err, int & status,
                     const std::string & name) {
    std::vector<std::pair<std::string, std::string>> headers = {{"Content-Type", "application/json"},
                                                                {"Accept", "application/json, text/event-stream"}};
    std::string version, session;
    {
        std::lock_guard lk(mu_);
        version = version_;
        session = session_id_;
    }
    if (stateless) {
        headers.emplace_back("MCP-Protocol-Version", kStateless);
        headers.emplace_back("Mcp-Method", method);
        if (!name.empty()) headers.emplace_back("Mcp-Name", name);
    } else {
        if (!version.empty()) headers.emplace_back("MCP-Protocol-Version", version);
        if (!session.empty()) headers.emplace_back("MCP-Session-Id", session);
    }
    for (const auto & [k, v] : spec_.headers) {
        std::string resolved;
        if (!resolve_secret(v, resolved, err)) return json();
        headers.emplace_back(k, resolved);
    }
    const HttpReply r = http_request("POST", spec_.url, headers, msg.dump(), spec_.timeout_ms, 8 << 20, guard_);
    status = r.status;
    spdlog::debug("mcp {} {}: HTTP {} {} ({} bytes) {}", spec_.url, method, r.status, r.error, r.body.size(),
                  r.body.substr(0, 300));
    if (!r.error.empty()) {
        err = r.error;
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

bool McpClient::initialize(std::string & err) {
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
    json res = post("initialize", msg, false, err, status, {});
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
         status, {});
    err.clear();
    return true;
}

bool McpClient::ready(std::string & err) {
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
    json res = post("server/discover", msg, true, derr, status, {});
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
    return initialize(err);
}

json McpClient::rpc(const std::string & method, json params, std::string & err, const std::string & name) {
    for (int attempt = 0; attempt < 2; ++attempt) {
        err.clear();
        if (!ready(err)) return json();
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
        json res = post(method, msg, stateless, err, status, name);
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

std::string McpClient::list_tools(std::vector<agent::HttpToolSpec> & out) {
    std::string cursor, err;
    std::set<std::string> allowed(spec_.allowed_tools.begin(), spec_.allowed_tools.end());
    for (int page = 0; page < 100; ++page) {
        json params = json::object();
        if (!cursor.empty()) params["cursor"] = cursor;
        json res = rpc("tools/list", params, err);
        if (!err.empty()) return "MCP server " + spec_.url + ": tools/list failed: " + err;
        const size_t first = out.size();
        mcp_tools_page(res, allowed, out, cursor);
        for (size_t i = first; i < out.size(); ++i) {
            out[i].url = spec_.url;
            out[i].mcp_url = spec_.url;
            out[i].timeout_ms = spec_.timeout_ms;
            out[i].headers = spec_.headers;
        }
        if (cursor.empty()) return {};
    }
    return "MCP server " + spec_.url + ": tools/list did not end after 100 pages";
}

ToolResult McpClient::call_tool(const std::string & name, const std::string & arguments, const std::string & key) {
    const auto t0 = std::chrono::steady_clock::now();
    ToolResult r;
    r.attempts = 1;
    json args = json::parse(arguments, nullptr, false);
    if (!args.is_object()) args = json::object();
    json params = {{"name", name}, {"arguments", args}, {"_meta", {{"io.armada/idempotencyKey", key}}}};
    std::string err;
    json res = rpc("tools/call", params, err, name);
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

std::string import_mcp_tools(agent::AgentSpec & a, const SsrfGuard & guard) {
    std::set<std::string> names;
    for (const auto & t : a.tools)
        names.insert(t.name);
    for (const auto & m : a.mcp_servers) {
        McpClient c(m, guard);
        std::vector<agent::HttpToolSpec> tools;
        if (auto err = c.list_tools(tools); !err.empty()) return err;
        for (auto & t : tools) {
            if (!names.insert(t.name).second)
                return "MCP server " + m.url + ": tool '" + t.name + "' clashes with another tool";
            a.tools.push_back(std::move(t));
        }
    }
    return {};
}

std::shared_ptr<McpClient> RoutingTransport::client(const agent::HttpToolSpec & spec) {
    std::lock_guard lk(mu_);
    auto & c = clients_[spec.mcp_url];
    if (!c) {
        agent::McpServerSpec m;
        m.url = spec.mcp_url;
        m.headers = spec.headers;
        m.timeout_ms = spec.timeout_ms;
        c = std::make_shared<McpClient>(m, guard_);
    }
    return c;
}

void RoutingTransport::call(const agent::HttpToolSpec & spec, const ToolCall & call,
                            std::function<void(ToolResult)> done) {
    if (spec.mcp_url.empty()) return http_.call(spec, call, std::move(done));
    boost::asio::post(pool_, [c = client(spec), call, done = std::move(done)] {
        done(c->call_tool(call.name, call.arguments, call.idempotency_key));
    });
}

}  // namespace armada::tools

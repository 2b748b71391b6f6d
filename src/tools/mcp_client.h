#pragma once

#include "tools/client_calls.h"
#include "tools/ssrf.h"
#include "tools/tenant_gate.h"
#include "tools/tool_spec.h"
#include "tools/tool_transport.h"

#include <boost/asio/ssl/context.hpp>

#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace armada::tools {

//! A client of one MCP server over Streamable HTTP.
//!
//! It first tries protocol 2026-07-28 (stateless: `server/discover`, `_meta` on every request,
//! `MCP-Protocol-Version` and `Mcp-Method` headers). If the server does not offer it, it falls
//! back to 2025-11-25: `initialize`, `notifications/initialized`, then `MCP-Session-Id` and
//! `MCP-Protocol-Version` on every request, initializing again when the server answers 404 for an
//! expired session. Calls block the calling thread; run them on worker threads. Thread-safe.
class McpClient {
  public:
    //! `tls` verifies https:// servers; null refuses them.
    McpClient(McpServerSpec spec, const SsrfGuard & guard, boost::asio::ssl::context * tls = nullptr)
        : spec_(std::move(spec)), guard_(guard), tls_(tls) {}

    //! Lists the server's tools named in `allowed` (empty: all), following `nextCursor` pages,
    //! all within `budget_ms` (0: each request within the server's timeout). Returns an error
    //! message.
    std::string list_tools(std::vector<HttpToolSpec> & out, const std::vector<std::string> & allowed,
                           int budget_ms = 0);
    //! Calls one tool; failures come back as an error result for the model.
    //! `traceparent` goes with each request the call makes.
    ToolResult call_tool(const std::string & name, const std::string & arguments, const std::string & key,
                         const std::string & traceparent = {});
    //! The protocol version in use ("" before the first request).
    std::string protocol();

  private:
    //! When a whole operation (a listing) must end; each request also keeps the server's timeout.
    using Deadline = std::optional<std::chrono::steady_clock::time_point>;
    nlohmann::json rpc(const std::string & method, nlohmann::json params, std::string & err, const Deadline & dl,
                       const std::string & name = {});
    nlohmann::json post(const std::string & method, const nlohmann::json & msg, bool stateless, std::string & err,
                        int & status, const std::string & name, const Deadline & dl);
    //! Milliseconds the next request may take: the server's timeout, within the deadline.
    int request_timeout_ms(const Deadline & dl) const;
    bool ready(std::string & err, const Deadline & dl);
    bool initialize(std::string & err, const Deadline & dl);

    McpServerSpec spec_;
    const SsrfGuard & guard_;
    boost::asio::ssl::context * tls_;
    std::mutex mu_;
    std::string version_;     // guarded by mu_
    std::string session_id_;  // guarded by mu_
    bool stateless_ = false;  // guarded by mu_
    int64_t next_id_ = 1;     // guarded by mu_
};

//! MCP clients by tenant, server and header set, so a connection (and an MCP session) opened
//! with one tenant's headers never serves another tenant. The least recently used client goes
//! beyond `capacity`.
class McpClients {
  public:
    McpClients(const SsrfGuard & guard, boost::asio::ssl::context * tls, size_t capacity = 256)
        : guard_(guard), tls_(tls), capacity_(capacity) {}
    std::shared_ptr<McpClient> get(const std::string & tenant, const McpServerSpec & spec);
    size_t size() const;

  private:
    const SsrfGuard & guard_;
    boost::asio::ssl::context * tls_;
    size_t capacity_;
    mutable std::mutex mu_;
    std::list<std::string> lru_;  // guarded by mu_, most recent first
    std::map<std::string, std::pair<std::shared_ptr<McpClient>, std::list<std::string>::iterator>> clients_;
};

//! Appends the tools of `servers` to `tools` (blocking; run at start-up or on a worker).
//! Returns an error message naming the server, or a tool whose name is taken.
std::string import_mcp_tools(const std::vector<McpServerSpec> & servers, std::vector<HttpToolSpec> & tools,
                             const SsrfGuard & guard, boost::asio::ssl::context * tls, int budget_ms = 0);

//! Routes calls: MCP-imported tools to their server (on the client-call workers, per tenant),
//! others to HTTP (at most `http_gate`'s limit in flight per tenant).
class RoutingTransport : public ToolTransport {
  public:
    RoutingTransport(ToolTransport & http, McpClients & clients, ClientCalls & calls, TenantGate & http_gate)
        : http_(http), clients_(clients), calls_(calls), gate_(http_gate) {}
    void call(const HttpToolSpec & spec, const ToolCall & call, std::function<void(ToolResult)> done) override;

  private:
    ToolTransport & http_;
    McpClients & clients_;
    ClientCalls & calls_;
    TenantGate & gate_;
};

}  // namespace armada::tools

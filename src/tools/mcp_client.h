#pragma once

#include "agent/agent_spec.h"
#include "tools/ssrf.h"
#include "tools/tool_transport.h"

#include <boost/asio/thread_pool.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
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
    McpClient(agent::McpServerSpec spec, const SsrfGuard & guard) : spec_(std::move(spec)), guard_(guard) {}

    //! Lists the server's tools, following `nextCursor` pages. Returns an error message.
    std::string list_tools(std::vector<agent::HttpToolSpec> & out);
    //! Calls one tool; failures come back as an error result for the model.
    ToolResult call_tool(const std::string & name, const std::string & arguments, const std::string & key);
    //! The protocol version in use ("" before the first request).
    std::string protocol();

  private:
    nlohmann::json rpc(const std::string & method, nlohmann::json params, std::string & err,
                       const std::string & name = {});
    nlohmann::json post(const std::string & method, const nlohmann::json & msg, bool stateless, std::string & err,
                        int & status, const std::string & name);
    bool ready(std::string & err);
    bool initialize(std::string & err);

    agent::McpServerSpec spec_;
    const SsrfGuard & guard_;
    std::mutex mu_;
    std::string version_;     // guarded by mu_
    std::string session_id_;  // guarded by mu_
    bool stateless_ = false;  // guarded by mu_
    int64_t next_id_ = 1;     // guarded by mu_
};

//! Imports the tools of the agent's MCP servers into its tool list (blocking; run at start-up
//! or on a worker). Returns an error message naming the server.
std::string import_mcp_tools(agent::AgentSpec & a, const SsrfGuard & guard);

//! Routes calls: MCP-imported tools to their server (on a small worker pool), others to HTTP.
class RoutingTransport : public ToolTransport {
  public:
    RoutingTransport(ToolTransport & http, const SsrfGuard & guard, int workers = 4)
        : http_(http), guard_(guard), pool_(size_t(workers)) {}
    ~RoutingTransport() override { pool_.join(); }
    void call(const agent::HttpToolSpec & spec, const ToolCall & call, std::function<void(ToolResult)> done) override;

  private:
    std::shared_ptr<McpClient> client(const agent::HttpToolSpec & spec);
    ToolTransport & http_;
    const SsrfGuard & guard_;
    boost::asio::thread_pool pool_;
    std::mutex mu_;
    std::map<std::string, std::shared_ptr<McpClient>> clients_;  // guarded by mu_
};

}  // namespace armada::tools

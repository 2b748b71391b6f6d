#pragma once

#include "agent/ports.h"
#include "api/auth.h"
#include "api/http_server.h"
#include "api/json_util.h"
#include "engine/chat_format.h"
#include "engine/engine_set.h"
#include "obs/trace.h"
#include "store/store.h"
#include "tools/client_calls.h"
#include "tools/mcp_client.h"

#include <boost/asio/any_io_executor.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace armada::api {

//! OpenAI's Responses API over the engine: `input` as text or items, `instructions`,
//! `previous_response_id` (the conversation is kept server-side, and the engine's prefix match
//! reuses its KV while resident), function tools executed by the client, streaming events with
//! `sequence_number`, and stored responses that belong to the API key that made them.
//! Stored responses are written to the checkpoint store, so they survive a restart.
class ResponsesService {
  public:
    //! MCP servers a request names are reached through `mcp` (per tenant and header set) on the
    //! `calls` workers; their tools are listed within `discover_budget_ms`.
    ResponsesService(std::shared_ptr<engine::Model> model, engine::EngineSet & engine, store::Store & store,
                     boost::asio::any_io_executor io, tools::McpClients & mcp, tools::ClientCalls & calls,
                     int discover_budget_ms = 10000);
    ~ResponsesService();

    //! Stored responses belong to `caller.tenant`; tokens are charged to `caller.account`.
    //! `trace`: the request's W3C context, the parent of each MCP call's `execute_tool` span.
    void create(const json & body, const Caller & caller, std::shared_ptr<Responder> out,
                std::optional<obs::TraceContext> trace = std::nullopt);
    void get(const std::string & id, const std::string & tenant, const std::shared_ptr<Responder> & out);
    void erase(const std::string & id, const std::string & tenant, const std::shared_ptr<Responder> & out);
    //! GPU pools: a model step the routing rules send to a pool runs there (only its prompt, token
    //! limit and sampling leave the node); the loop, MCP calls and the stored response stay here.
    //! One the pool cannot take runs on this node if it fits. Set before requests arrive.
    void set_pool(agent::StepPool * pool) { pool_ = pool; }

  private:
    struct Run;
    //! Renders the prompt and submits the first model step (throws ApiError).
    void begin(const std::shared_ptr<Run> & run);
    //! The server an `{"type":"mcp"}` tool names, checked (throws ApiError 400).
    static std::pair<std::string, tools::McpServerSpec> mcp_server(const json & t);
    //! Adds a server's listed tools to the run.
    void add_mcp_tools(Run & run, const std::string & label, const std::shared_ptr<tools::McpClient> & client,
                       const std::vector<tools::HttpToolSpec> & listed);
    //! Calls an MCP tool on a client-call worker, sending `traceparent` with it; `done` runs there.
    void run_mcp(const std::string & tenant, const std::shared_ptr<tools::McpClient> & client,
                 const common_chat_tool_call & call, const std::string & traceparent,
                 std::function<void(tools::ToolResult)> done);

    std::shared_ptr<engine::Model> model_;
    engine::EngineSet & engine_;
    store::Store & store_;
    boost::asio::any_io_executor io_;
    engine::ChatFormat format_;
    tools::McpClients & mcp_;
    tools::ClientCalls & calls_;
    int discover_budget_ms_;
    agent::StepPool * pool_ = nullptr;
};

}  // namespace armada::api

#pragma once

#include "api/http_server.h"
#include "api/json_util.h"
#include "engine/chat_format.h"
#include "engine/engine_set.h"
#include "store/store.h"
#include "tools/mcp_client.h"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/thread_pool.hpp>

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
    ResponsesService(std::shared_ptr<engine::Model> model, engine::EngineSet & engine, store::Store & store,
                     boost::asio::any_io_executor io, const tools::SsrfGuard & guard);
    ~ResponsesService();

    void create(const json & body, const std::string & owner, std::shared_ptr<Responder> out);
    void get(const std::string & id, const std::string & owner, const std::shared_ptr<Responder> & out);
    void erase(const std::string & id, const std::string & owner, const std::shared_ptr<Responder> & out);

  private:
    struct Run;
    //! Lists an `{"type":"mcp"}` tool's server tools into `tools` (blocking, bounded by its timeout).
    void add_mcp_tools(Run & run, const json & t, std::vector<common_chat_tool> & tools);
    //! Calls an MCP tool on a worker thread; `done` runs there.
    void run_mcp(const std::shared_ptr<tools::McpClient> & client, const common_chat_tool_call & call,
                 std::function<void(tools::ToolResult)> done);

    std::shared_ptr<engine::Model> model_;
    engine::EngineSet & engine_;
    store::Store & store_;
    boost::asio::any_io_executor io_;
    engine::ChatFormat format_;
    const tools::SsrfGuard & guard_;
    boost::asio::thread_pool pool_;
    std::mutex mu_;
    std::map<std::string, std::shared_ptr<tools::McpClient>> mcp_clients_;  // guarded by mu_
};

}  // namespace armada::api

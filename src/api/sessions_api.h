#pragma once

#include "agent/session_manager.h"
#include "api/auth.h"
#include "api/http_server.h"
#include "api/json_util.h"

#include <functional>
#include <memory>
#include <string>

namespace armada::api {

//! The sessions API: agents, sessions, their messages and their event streams. Maps JSON to the
//! agent room's native calls and back.
class SessionsApi {
  public:
    //! Completes an agent before it is registered (imports its MCP tools) off the I/O threads:
    //! `done` gets an error message (empty on success) and the completed agent. Returns false
    //! when the caller's tenant has too many such calls in flight.
    using Prepare = std::function<bool(agent::AgentSpec, const std::string & tenant,
                                       std::function<void(std::string, agent::AgentSpec)> done)>;
    SessionsApi(agent::SessionManager & mgr, Prepare prepare) : mgr_(mgr), prepare_(std::move(prepare)) {}

    //! True when `path` belongs to this API; then it handled the request (or threw ApiError).
    bool handle(const HttpRequest & req, const Caller & caller, const std::shared_ptr<Responder> & out,
                std::string & route_name);

  private:
    void declare(const HttpRequest & req, const std::string & tenant, const std::shared_ptr<Responder> & out);
    void events(const std::string & id, const std::string & tenant, const HttpRequest & req,
                const std::shared_ptr<Responder> & out);
    agent::SessionManager & mgr_;
    Prepare prepare_;
};

//! The agent as `GET /v1/agents/{id}` shows it: its tools with their schemas (`with_spec`), and
//! its declaration (canonical JSON) and MCP server URLs when `with_source`.
json agent_json(const agent::AgentSpec & a, bool with_spec, bool with_source);

}  // namespace armada::api

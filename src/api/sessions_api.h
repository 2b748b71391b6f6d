#pragma once

#include "agent/session_manager.h"
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
    //! `prepare` completes an agent before it is registered (imports its MCP tools); it returns
    //! an error message, empty on success.
    using Prepare = std::function<std::string(agent::AgentSpec &)>;
    SessionsApi(agent::SessionManager & mgr, Prepare prepare) : mgr_(mgr), prepare_(std::move(prepare)) {}

    //! True when `path` belongs to this API; then it handled the request (or threw ApiError).
    bool handle(const HttpRequest & req, const std::string & owner, const std::shared_ptr<Responder> & out,
                std::string & route_name);

  private:
    void events(const std::string & id, const std::string & owner, const HttpRequest & req,
                const std::shared_ptr<Responder> & out);
    agent::SessionManager & mgr_;
    Prepare prepare_;
};

//! Stable short hash of an API key, stored as a session's owner (never the key itself).
std::string owner_of(const std::string & api_key);

}  // namespace armada::api

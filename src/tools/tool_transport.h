#pragma once

#include "tools/tool_spec.h"

#include <functional>
#include <string>

namespace armada::tools {

//! One call the model made, ready to send.
struct ToolCall {
    std::string session_id;
    std::string call_id;
    std::string name;
    std::string arguments;        // JSON text, validated by the grammar
    std::string idempotency_key;  // <session>:<step>:<call>; the same on every retry and resume
    //! Whose call it is: connections and MCP sessions opened for one tenant never serve another.
    std::string tenant;
    //! W3C trace context of the call's span, sent as `traceparent` ("" : none).
    std::string traceparent;
    //! Asked before each retry (on an I/O thread): false ends the call unsent (`not_sent`), for
    //! the caller to send again once it knows the session is still its own. A node whose lease
    //! may have lapsed may have lost the session, whose next node sends the call itself. Unset:
    //! retries go out at once.
    std::function<bool()> may_send;
};

//! How a call ended. A failure is still a result: it goes to the model as an error.
struct ToolResult {
    std::string content;  // UTF-8, capped
    bool is_error = false;
    int http_status = 0;
    int attempts = 0;
    double latency_s = 0;
    //! A retry was due but `may_send` said no: not a result, the call is to be sent again.
    bool not_sent = false;
};

//! Sends tool calls. Implementations run on I/O threads and never block the caller; `done` runs
//! exactly once, on an I/O thread.
class ToolTransport {
  public:
    virtual ~ToolTransport() = default;
    virtual void call(const HttpToolSpec & spec, const ToolCall & call, std::function<void(ToolResult)> done) = 0;
};

}  // namespace armada::tools

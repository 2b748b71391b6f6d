#pragma once

// How the gateway's units answer a client with an error: the node's error shape
// (api/errors.h), with a Retry-After when a retry may succeed.

#include "api/auth.h"
#include "api/http_server.h"
#include "cluster/quota.h"
#include "gateway/counters.h"

#include <memory>
#include <string>
#include <vector>

namespace armada::gateway {

void send_error(const std::shared_ptr<api::Responder> & out, int status, const std::string & msg, int retry_after = 0,
                const std::string & code = {});

//! 503: PostgreSQL cannot be reached now.
void store_down(const std::shared_ptr<api::Responder> & out);

//! A refusal thrown inside a route and sent by the gateway's request handler.
struct ApiErrorReply {
    int status;
    std::string message;
    int retry_after_s;
};

//! 429 for a quota `caller` is over, with Retry-After, counted by quota.
void refuse(const std::shared_ptr<api::Responder> & out, const api::Caller & caller, const cluster::QuotaRefusal & r,
            GatewayCounters & counts);

//! The session states that end a session.
const std::vector<std::string> & ended_states();

}  // namespace armada::gateway

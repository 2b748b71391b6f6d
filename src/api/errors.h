#pragma once

#include <stdexcept>
#include <string>

namespace armada::api {

//! A refusal the client caused or must handle. Thrown inside handlers and turned into an
//! OpenAI-shaped error body by the one wrapper at the HTTP boundary (`Router::dispatch`).
struct ApiError : std::runtime_error {
    ApiError(int status, const std::string & message, std::string param = {}, std::string code = {})
        : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)) {}
    int status;
    std::string param;
    std::string code;
    int retry_after_s = 0;  // adds Retry-After when > 0
};

//! 429 for a full engine queue, with Retry-After.
inline ApiError at_capacity() {
    ApiError e(429, "the server is at capacity; retry shortly", {}, "queue_full");
    e.retry_after_s = 1;
    return e;
}

//! OpenAI error type for an HTTP status.
const char * error_type(int status);

//! `{"error":{"message","type","param","code"}}` with invalid UTF-8 replaced.
std::string error_body(int status, const std::string & message, const std::string & param = {},
                       const std::string & code = {});

}  // namespace armada::api

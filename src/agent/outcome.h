#pragma once

#include <string>

namespace armada::agent {

//! Outcome of a request to the session manager; `status` is an HTTP-like code (200, 400, 403,
//! 404, 409, 429, 503).
struct Outcome {
    int status = 200;
    std::string error;
    std::string id;
    int retry_after_s = 0;  // with 429/503
};

}  // namespace armada::agent

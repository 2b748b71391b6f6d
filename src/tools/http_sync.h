#pragma once

#include "tools/ssrf.h"

#include <map>
#include <string>
#include <vector>

namespace armada::tools {

//! A reply of `http_request`. `error` is set when no HTTP answer arrived.
struct HttpReply {
    int status = 0;
    std::map<std::string, std::string> headers;  // lower-case names
    std::string body;
    std::string error;
};

//! One HTTP/1.1 exchange that blocks the calling thread (not an I/O thread) for at most
//! `timeout_ms`. Every resolved address is checked by `guard` first. Body reads stop at
//! `max_body` bytes. For worker threads of the MCP client.
HttpReply http_request(const std::string & method, const std::string & url,
                       const std::vector<std::pair<std::string, std::string>> & headers, const std::string & body,
                       int timeout_ms, size_t max_body, const SsrfGuard & guard);

}  // namespace armada::tools

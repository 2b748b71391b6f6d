#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace armada::bench {

struct HttpResult {
    int status = 0;     // 0: no HTTP answer (see error)
    std::string body;   // whole body when no chunk callback was given
    std::string error;  // connect/send/read failure or timeout
    std::string retry_after;
};

//! One blocking HTTP/1.1 exchange for the load generator (client side: no SSRF guard).
//! `on_chunk` sees body bytes as they arrive (SSE) and may return false to stop reading.
HttpResult http_call(const std::string & method, const std::string & url, const std::string & body,
                     const std::vector<std::pair<std::string, std::string>> & headers, int timeout_ms,
                     const std::function<bool(std::string_view)> & on_chunk = {});

}  // namespace armada::bench

#include "bench/http_client.h"

#include "net/http_client.h"

namespace armada::bench {

HttpResult http_call(const std::string & method, const std::string & url, const std::string & body,
                     const std::vector<std::pair<std::string, std::string>> & headers, int timeout_ms,
                     const std::function<bool(std::string_view)> & on_chunk) {
    HttpResult out;
    if (url.rfind("http://", 0) != 0) {
        out.error = "not an http:// URL: " + url;
        return out;
    }
    armada::net::HttpOptions o;
    o.timeout_ms = timeout_ms;
    o.max_body = std::uint64_t(1) << 40;
    o.user_agent = "armada-bench";
    if (on_chunk) {
        // A stream is bounded by the same time as a whole answer, between two of its pieces.
        o.idle_ms = timeout_ms;
        o.on_head = [](const armada::net::HttpReply &) { return true; };
        o.on_chunk = on_chunk;
    }
    auto r = armada::net::http_call({method, url, headers, body}, o);
    out.status = r.status;
    out.body = std::move(r.body);
    out.error = std::move(r.error);
    if (const auto * ra = r.header("retry-after")) out.retry_after = *ra;
    return out;
}

}  // namespace armada::bench

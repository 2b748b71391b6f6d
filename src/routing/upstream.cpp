#include "routing/upstream.h"

#include "net/http_client.h"
#include "net/tls.h"

#include <boost/asio/ssl/context.hpp>

#include <cctype>
#include <mutex>

namespace armada::routing {

namespace {

//! What https:// upstreams are checked against (set_upstream_tls); the system's CA store until
//! a process sets it.
std::mutex tls_mu;
std::shared_ptr<boost::asio::ssl::context> & upstream_tls() {
    static std::shared_ptr<boost::asio::ssl::context> ctx;
    return ctx;
}

//! The headers of a node's answer that a client needs.
bool passed_back(const std::string & name) {
    std::string lower = name;
    for (auto & ch : lower)
        ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return lower == "content-type" || lower == "retry-after" || lower == "x-request-id" ||
           lower.rfind("x-ratelimit", 0) == 0 || lower == "www-authenticate";
}

UpstreamReply reply_of(armada::net::HttpReply r) {
    UpstreamReply out;
    out.status = r.status;
    out.error = std::move(r.error);
    out.body = std::move(r.body);
    for (const auto & [k, v] : r.headers) {
        if (passed_back(k)) out.headers.emplace_back(k, v);
    }
    out.streamed = r.streamed;
    out.sent = r.sent;
    out.invalid = r.failure == armada::net::HttpFailure::bad_request;
    return out;
}

}  // namespace

void set_upstream_tls(std::shared_ptr<boost::asio::ssl::context> tls) {
    std::lock_guard lk(tls_mu);
    upstream_tls() = std::move(tls);
}

UpstreamReply forward(const std::string & base, const std::string & method, const std::string & target,
                      const HeaderList & headers, const std::string & body, int timeout_ms,
                      const std::function<bool(const UpstreamReply &)> & on_head,
                      const std::function<bool(std::string_view)> & on_chunk,
                      const std::shared_ptr<CancelToken> & cancel, int idle_ms) {
    std::shared_ptr<boost::asio::ssl::context> tls;
    if (base.rfind("https://", 0) == 0) {
        std::lock_guard lk(tls_mu);
        if (!upstream_tls()) {
            std::string err;
            upstream_tls() = armada::net::client_tls({}, err);
        }
        tls = upstream_tls();
        if (!tls) {
            UpstreamReply out;
            out.error = "no TLS for " + base + ": the system's CA store cannot be loaded";
            return out;
        }
    } else if (base.rfind("http://", 0) != 0) {
        UpstreamReply out;
        out.error = "not an http:// or https:// URL: " + base;
        return out;
    }
    armada::net::HttpOptions o;
    o.timeout_ms = timeout_ms;
    o.idle_ms = idle_ms;
    o.max_body = std::uint64_t(1) << 40;
    o.tls = tls.get();
    o.ca_setting = "credentials.nodes.ca_file";
    o.reuse = true;
    // A node sees the headers the gateway chose and no others (the client's own User-Agent among
    // them, when it passes one on).
    o.user_agent.clear();
    o.cancel = cancel;
    if (on_head && on_chunk) {
        o.on_head = [&](const armada::net::HttpReply & head) { return on_head(reply_of(head)); };
        o.on_chunk = on_chunk;
    }
    // The target is checked by the client as written: one request to the gateway is at most one
    // request to the node.
    if (target.empty() || target[0] != '/') {
        UpstreamReply out;
        out.invalid = true;
        out.error = "the target holds bytes a request may not carry; nothing was sent";
        return out;
    }
    return reply_of(armada::net::http_call({method, base + target, headers, body}, o));
}

}  // namespace armada::routing

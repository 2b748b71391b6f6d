#pragma once

#include "net/http_client.h"

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace boost::asio::ssl {
class context;
}

namespace armada::routing {

//! What `forward` checks https:// upstreams against (the system's CA store until it is set; the
//! cluster's CA, `credentials: nodes:`, for TLS between its processes). Set once at start.
void set_upstream_tls(std::shared_ptr<boost::asio::ssl::context> tls);

using HeaderList = armada::net::HeaderList;

//! Lets another thread stop a forward that is blocked reading (its client went away while the
//! node's stream is quiet).
using CancelToken = armada::net::CancelToken;

//! The answer of a node to a forwarded request.
struct UpstreamReply {
    int status = 0;      // 0: no HTTP answer (see error)
    std::string error;   // connect/send/read failure or timeout
    HeaderList headers;  // the ones a client needs (content type, retry-after, request id)
    std::string body;    // the whole body when no chunk callback was given
    bool streamed = false;
    //! The request reached the node (written whole): without an answer, it may have been acted on.
    bool sent = false;
    //! Nothing was sent: the method, target or a header held bytes that could split the request
    //! (CR, LF, NUL, ...). A fault of the request, not of the node.
    bool invalid = false;
};

//! Sends one request to a node (`base` is http://host:port or https://host:port) through the
//! outgoing client (net/http_client.h), on a kept-alive connection, and reads its answer. `on_head` runs
//! once the status and headers are in and says whether to stream the body: then `on_chunk` gets
//! the body as it arrives (SSE) and may return false to stop. Blocking; run on a worker thread.
//! `timeout_ms` bounds the connect and the head, and the whole body unless it streams; a stream
//! that sends nothing for `idle_ms` (0: no limit) is cut, with an error. A method, target, header
//! name or value that is not clean (gateway/checks.h) is never written: the reply says `invalid`.
//! A kept connection goes back to the pool only after a whole 2xx answer: any other answer, or a
//! body not read to its end, closes it.
UpstreamReply forward(const std::string & base, const std::string & method, const std::string & target,
                      const HeaderList & headers, const std::string & body, int timeout_ms,
                      const std::function<bool(const UpstreamReply &)> & on_head = {},
                      const std::function<bool(std::string_view)> & on_chunk = {},
                      const std::shared_ptr<CancelToken> & cancel = nullptr, int idle_ms = 0);

}  // namespace armada::routing

#pragma once

// The one outgoing HTTP/1.1 client. Tools and MCP, the gateway's relays and pools, the benches,
// etcd and the Kubernetes client all call through it. It does plain TCP or TLS, blocking or
// asynchronous calls, streamed bodies, deadlines, redirects and kept-alive connections.
// Its callers add their own policy on top: which addresses a call may reach (tools' SSRF guard),
// which CA they trust, retries, and what an answer means.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/address.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace boost::asio::ssl {
class context;
}

namespace armada::net {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

//! Lets another thread stop a blocking call, for example one reading a quiet stream whose client
//! went away. `cancel` shuts the socket down, which wakes the read.
class CancelToken {
  public:
    void cancel();
    bool cancelled();
    //! Used by the client: the socket of the call in progress (-1: none now).
    void attach(int fd);

  private:
    std::mutex mu_;
    int fd_ = -1;
    bool cancelled_ = false;
};

struct HttpRequest {
    std::string method = "GET";
    std::string url;  // http://host[:port]/target or https://...
    HeaderList headers;
    std::string body;  // sent when not empty, or with any method but GET and HEAD
};

//! Why a call has no whole answer.
enum class HttpFailure {
    none,
    bad_request,  // the URL, the method, the target or a header cannot be written; nothing was sent
    no_tls,       // an https:// URL, and the call has no TLS context
    blocked,      // `admit` refused every address the host resolved to
    resolve,
    connect,
    tls,          // the TLS handshake failed on the way (another try may work)
    tls_refused,  // the peer's certificate did not verify (another try will not)
    not_sent,     // `may_send` said no just before the request would have gone
    send,
    read,
    timeout,    // no answer within timeout_ms
    idle,       // a streamed body sent nothing for idle_ms
    too_large,  // the body passed max_body
    redirects,  // more redirects than max_redirects, or one to a URL that is not valid
    cancelled,  // the CancelToken was used, or `stop` was set
};

//! What a call got back. `error` is empty only when a whole answer arrived (or a streamed one
//! that `on_chunk` stopped).
struct HttpReply {
    int status = 0;      // 0: no answer
    HeaderList headers;  // as the server wrote their names
    std::string body;    // unless streamed
    HttpFailure failure = HttpFailure::none;
    std::string error;
    bool connected = false;  // a connection (and its TLS) was made
    bool sent = false;       // the request was written whole: it may have been acted on
    bool streamed = false;   // the body went to on_chunk
    bool truncated = false;  // the body was cut at max_body (cut_body)
    std::string url;         // the URL that answered, after redirects

    //! The value of header `name` (any case), or null.
    const std::string * header(std::string_view name) const;
};

struct HttpOptions {
    //! Resolving, connecting, TLS, sending and the answer's head; the whole body too unless it
    //! streams. Redirects share it.
    int timeout_ms = 10000;
    //! A streamed body that sends nothing this long is cut (0: no limit).
    int idle_ms = 0;
    //! timeout_ms ends once the request is written: for a stream whose head comes only with its
    //! first message (etcd's watches and elections), which may be long in coming.
    bool head_may_wait = false;
    std::uint64_t max_body = 64ull << 20;
    //! Over max_body: keep the first max_body bytes and set `truncated` (false: fail too_large).
    bool cut_body = false;
    //! For https:// (the certificate must name the URL's host); null: https:// is refused. It
    //! must outlive the call.
    boost::asio::ssl::context * tls = nullptr;
    //! Named in the words of a certificate that does not verify: where the user adds a CA.
    std::string ca_setting = "the CA file";
    //! Says why an address may not be reached ("": it may). Every resolved address is asked,
    //! after each redirect too.
    std::function<std::string(const boost::asio::ip::address &)> admit;
    //! Redirects followed (0: a 3xx answer is returned as it is). One that leaves the first
    //! origin drops Authorization, Cookie, Proxy-Authorization and the headers in `sensitive`
    //! (lower-case names). 301, 302 and 303 go on as a GET.
    int max_redirects = 0;
    std::set<std::string> sensitive;
    //! Blocking calls only: use a kept-alive connection to the same origin, and keep this one
    //! after a whole 2xx answer. Not with `admit`: a kept connection is not resolved again.
    bool reuse = false;
    //! Called once the head is in; true streams the body to `on_chunk`, which may return false to
    //! stop reading.
    std::function<bool(const HttpReply &)> on_head;
    std::function<bool(std::string_view)> on_chunk;
    //! Asked just before each request is written; false: the call ends with not_sent.
    std::function<bool()> may_send;
    std::shared_ptr<CancelToken> cancel;
    //! Blocking calls only: set by another thread to end the call (looked at every 100 ms).
    const std::atomic<bool> * stop = nullptr;
    std::string user_agent = "armada";  // "": none sent
};

//! One call that blocks the calling thread (not an I/O thread).
HttpReply http_call(const HttpRequest & request, const HttpOptions & options);

//! The same call on `io`'s threads; `done` runs on one of them.
void http_call_async(boost::asio::any_io_executor io, HttpRequest request, HttpOptions options,
                     std::function<void(HttpReply)> done);

//! What a request leaving its first origin must not carry: Authorization, Cookie,
//! Proxy-Authorization, and `sensitive` (lower-case names).
bool dropped_across_origins(const std::string & header, const std::set<std::string> & sensitive);

//! How `http_download` behaves.
struct DownloadOptions {
    int connect_timeout_ms = 5000;  // resolving, connecting, TLS and the reply's head
    int idle_timeout_ms = 10000;    // the longest wait for the next piece of the body
    std::uint64_t max_bytes = 64ull << 30;
    boost::asio::ssl::context * tls = nullptr;  // for https:// (verification on)
    std::function<std::string(const boost::asio::ip::address &)> admit;
    //! Called with the reply's status and headers before any of the body is kept; a non-empty
    //! answer stops the download with that error.
    std::function<std::string(int status, const HeaderList & headers)> check;
};

//! The result of `http_download`: `error` is empty only when the whole body of a 200 reply is in
//! the file.
struct Download {
    int status = 0;
    HeaderList headers;
    std::uint64_t bytes = 0;  // of the body written to the file
    std::string error;
};

//! GET `url` into the file `path` (created or truncated), streamed: the body never sits whole in
//! memory. Blocks; no redirect is followed. A reply other than 200 is an error that quotes the
//! start of its body. The file is left as it is on error.
Download http_download(const std::string & url, const HeaderList & headers, const std::string & path,
                       const DownloadOptions & options);

}  // namespace armada::net

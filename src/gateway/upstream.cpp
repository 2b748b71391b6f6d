#include "gateway/upstream.h"

#include "gateway/checks.h"

#include "tools/http_tool.h"
#include "tools/tls.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <openssl/ssl.h>
#include <strings.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace armada::gateway {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

//! A kept-alive connection to a node, with the io_context its blocking calls run on: plain TCP,
//! or TLS over it (https://).
struct Conn {
    net::io_context ioc;
    std::unique_ptr<beast::tcp_stream> plain;
    std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure;
    beast::tcp_stream & tcp() { return secure ? secure->next_layer() : *plain; }
};

//! What https:// upstreams are checked against (set_upstream_tls); the system's CA store until
//! a process sets it.
std::mutex tls_mu;
std::shared_ptr<net::ssl::context> & upstream_tls() {
    static std::shared_ptr<net::ssl::context> ctx;
    return ctx;
}

//! Idle connections by node: a request reuses one instead of paying for a TCP handshake.
class Idle {
  public:
    //! A kept connection the node has not closed, or null. One it closed (a restart, a crash, its
    //! idle timeout) would take the request and answer nothing; the request would then count as
    //! sent, and could not go to another node.
    std::unique_ptr<Conn> take(const std::string & base) {
        std::lock_guard lk(mu_);
        auto & v = idle_[base];
        while (!v.empty()) {
            auto c = std::move(v.back());
            v.pop_back();
            char b;
            const ssize_t n = ::recv(c->tcp().socket().native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return c;  // open, and quiet
        }
        return nullptr;
    }
    void give(const std::string & base, std::unique_ptr<Conn> c) {
        std::lock_guard lk(mu_);
        auto & v = idle_[base];
        if (v.size() < 64) v.push_back(std::move(c));
    }

  private:
    std::mutex mu_;
    std::map<std::string, std::vector<std::unique_ptr<Conn>>> idle_;
};

Idle & idle() {
    static Idle i;
    return i;
}

//! Deadlines of the calls in progress: one thread expires each call's token when its time is up,
//! which shuts its socket down and so ends a blocking read (Beast's own timeouts only apply to
//! asynchronous operations).
class Deadlines {
  public:
    using Clock = std::chrono::steady_clock;
    uint64_t add(Clock::time_point at, std::shared_ptr<CancelToken> t) {
        std::lock_guard lk(mu_);
        if (!started_) {
            started_ = true;
            std::thread([this] { run(); }).detach();
        }
        const uint64_t id = ++next_;
        q_.emplace(std::make_pair(at, id), std::move(t));
        when_[id] = at;
        cv_.notify_one();
        return id;
    }
    void remove(uint64_t id) {
        std::lock_guard lk(mu_);
        auto it = when_.find(id);
        if (it == when_.end()) return;
        q_.erase({it->second, id});
        when_.erase(it);
    }

  private:
    void run() {
        std::unique_lock lk(mu_);
        for (;;) {
            if (q_.empty()) {
                cv_.wait(lk);
                continue;
            }
            const auto first = q_.begin()->first.first;
            if (Clock::now() < first) {
                cv_.wait_until(lk, first);
                continue;
            }
            auto t = std::move(q_.begin()->second);
            when_.erase(q_.begin()->first.second);
            q_.erase(q_.begin());
            lk.unlock();
            t->expire();
            lk.lock();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::pair<Clock::time_point, uint64_t>, std::shared_ptr<CancelToken>> q_;
    std::map<uint64_t, Clock::time_point> when_;
    uint64_t next_ = 0;
    bool started_ = false;
};

Deadlines & deadlines() {
    static auto * d = new Deadlines();  // never destroyed: its thread outlives static destruction
    return *d;
}

//! Takes a call's deadline off the list when the call ends (or starts streaming).
struct DeadlineGuard {
    uint64_t id = 0;
    void clear() {
        if (id != 0) deadlines().remove(id);
        id = 0;
    }
    ~DeadlineGuard() { clear(); }
};

}  // namespace

void CancelToken::cancel() {
    std::lock_guard lk(mu_);
    cancelled_ = true;
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool CancelToken::cancelled() {
    std::lock_guard lk(mu_);
    return cancelled_;
}

void CancelToken::expire() {
    std::lock_guard lk(mu_);
    expired_ = true;
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool CancelToken::expired() {
    std::lock_guard lk(mu_);
    return expired_;
}

void CancelToken::attach(int fd) {
    std::lock_guard lk(mu_);
    fd_ = fd;
    if ((cancelled_ || expired_) && fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void set_upstream_tls(std::shared_ptr<boost::asio::ssl::context> tls) {
    std::lock_guard lk(tls_mu);
    upstream_tls() = std::move(tls);
}

UpstreamReply forward(const std::string & base, const std::string & method, const std::string & target,
                      const HeaderList & headers, const std::string & body, int timeout_ms,
                      const std::function<bool(const UpstreamReply &)> & on_head,
                      const std::function<bool(std::string_view)> & on_chunk,
                      const std::shared_ptr<CancelToken> & cancel_in, int idle_ms) {
    const auto cancel = cancel_in ? cancel_in : std::make_shared<CancelToken>();
    DeadlineGuard deadline;
    deadline.id = deadlines().add(Deadlines::Clock::now() + std::chrono::milliseconds(timeout_ms), cancel);
    // Nothing that could end the request line or a header early is written: one request to the
    // gateway is at most one request to the node.
    {
        std::string bad;
        if (!header_name_ok(method))
            bad = "the method";
        else if (!target_ok(target))
            bad = "the target";
        for (const auto & [k, v] : headers) {
            if (bad.empty() && (!header_name_ok(k) || !header_value_ok(v))) bad = "header '" + k + "'";
        }
        if (!bad.empty()) {
            UpstreamReply out;
            out.invalid = true;
            out.error = bad + " holds bytes a request may not carry; nothing was sent";
            return out;
        }
    }
    tools::Url u;
    if (!tools::parse_url(base, u) || (u.scheme != "http" && u.scheme != "https")) {
        UpstreamReply out;
        out.error = "not an http:// or https:// URL: " + base;
        return out;
    }
    std::shared_ptr<net::ssl::context> tls;
    if (u.scheme == "https") {
        std::lock_guard lk(tls_mu);
        if (!upstream_tls()) {
            std::string err;
            upstream_tls() = tools::client_tls({}, err);
        }
        tls = upstream_tls();
        if (!tls) {
            UpstreamReply out;
            out.error = "no TLS for " + base + ": the system's CA store cannot be loaded";
            return out;
        }
    }
    http::request<http::string_body> req;
    req.version(11);
    if (const auto v = http::string_to_verb(method); v != http::verb::unknown)
        req.method(v);
    else
        req.method_string(method);
    req.target(target);
    for (const auto & [k, v] : headers) {
        // Framing and hop-by-hop headers are this function's own: a caller's could make the node
        // read the body, or the next request, differently from how it is written.
        if (strcasecmp(k.c_str(), "host") == 0 || strcasecmp(k.c_str(), "content-length") == 0 ||
            strcasecmp(k.c_str(), "transfer-encoding") == 0 || strcasecmp(k.c_str(), "connection") == 0 ||
            strcasecmp(k.c_str(), "keep-alive") == 0 || strcasecmp(k.c_str(), "te") == 0 ||
            strcasecmp(k.c_str(), "trailer") == 0 || strcasecmp(k.c_str(), "upgrade") == 0 ||
            strcasecmp(k.c_str(), "proxy-connection") == 0 || strcasecmp(k.c_str(), "expect") == 0)
            continue;
        req.set(k, v);
    }
    req.set(http::field::host, u.host + ":" + u.port);
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    for (int attempt = 0;; ++attempt) {
        UpstreamReply out;
        std::unique_ptr<Conn> c = attempt == 0 ? idle().take(base) : nullptr;
        const bool reused = c != nullptr;
        bool sent = false, got_head = false;
        try {
            if (!c) {
                c = std::make_unique<Conn>();
                if (tls)
                    c->secure = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(c->ioc, *tls);
                else
                    c->plain = std::make_unique<beast::tcp_stream>(c->ioc);
                c->tcp().expires_after(std::chrono::milliseconds(timeout_ms));
                tcp::resolver resolver(c->ioc);
                // Asynchronous, so the stream's deadline bounds it (a node that drops SYNs would
                // hold a synchronous connect for the kernel's minutes).
                beast::error_code cec = net::error::timed_out;
                c->tcp().async_connect(resolver.resolve(u.host, u.port),
                                       [&cec](beast::error_code e, const tcp::endpoint &) { cec = e; });
                c->ioc.run();
                c->ioc.restart();
                if (cec) throw beast::system_error(cec);
                if (c->secure) {
                    // The certificate must name the host the URL does.
                    tools::expect_peer_name(c->secure->native_handle(), u.host);
                    if (cancel) cancel->attach(c->tcp().socket().native_handle());
                    beast::error_code hec;
                    c->secure->handshake(net::ssl::stream_base::client, hec);
                    if (hec)
                        throw std::runtime_error(
                            tools::tls_failure(hec, c->secure->native_handle(), u.host, "credentials.nodes.ca_file"));
                }
            }
            c->tcp().expires_after(std::chrono::milliseconds(timeout_ms));
            if (cancel) cancel->attach(c->tcp().socket().native_handle());
            auto exchange = [&](auto & stream) {
                http::write(stream, req);
                sent = true;
                out.sent = true;
                beast::flat_buffer buf;
                http::response_parser<http::buffer_body> p;
                p.body_limit(std::uint64_t(1) << 40);
                http::read_header(stream, buf, p);
                got_head = true;
                out.status = int(p.get().result_int());
                for (const auto & f : p.get()) {
                    const std::string name(f.name_string());
                    std::string lower = name;
                    for (auto & ch : lower)
                        ch = char(std::tolower(static_cast<unsigned char>(ch)));
                    if (lower == "content-type" || lower == "retry-after" || lower == "x-request-id" ||
                        lower.rfind("x-ratelimit", 0) == 0 || lower == "www-authenticate")
                        out.headers.emplace_back(name, std::string(f.value()));
                }
                const bool stream_body = on_head && on_chunk && on_head(out);
                out.streamed = stream_body;
                char tmp[16384];
                bool reading = true;
                // A stream (SSE) may be quiet for long: only the connect and the head have a deadline.
                if (stream_body) {
                    c->tcp().expires_never();
                    deadline.clear();
                }
                // A stream may be quiet for long, unless the caller says how long is too long.
                auto rearm = [&] {
                    if (!stream_body || idle_ms <= 0) return;
                    deadline.clear();
                    deadline.id = deadlines().add(Deadlines::Clock::now() + std::chrono::milliseconds(idle_ms), cancel);
                };
                rearm();
                while (!p.is_done() && reading) {
                    p.get().body().data = tmp;
                    p.get().body().size = sizeof tmp;
                    beast::error_code ec;
                    http::read_some(stream, buf, p, ec);
                    if (ec == http::error::need_buffer) ec = {};
                    if (ec) throw beast::system_error(ec);
                    const size_t n = sizeof tmp - p.get().body().size;
                    if (n == 0) continue;
                    if (stream_body) {
                        reading = on_chunk(std::string_view(tmp, n));
                        rearm();
                    } else
                        out.body.append(tmp, n);
                }
                // A whole 2xx answer on a connection both sides keep may serve the next request,
                // when nothing more came after it (in the buffer, or held inside TLS).
                bool drained = buf.size() == 0;
                if (c->secure) {
                    SSL * ssl = c->secure->native_handle();
                    drained = drained && SSL_pending(ssl) == 0 && BIO_ctrl_pending(SSL_get_rbio(ssl)) == 0;
                }
                return drained && !stream_body && p.is_done() && p.keep_alive() && out.status >= 200 &&
                       out.status < 300;
            };
            const bool keep = c->secure ? exchange(*c->secure) : exchange(*c->plain);
            if (cancel) cancel->attach(-1);
            // After any answer but a whole 2xx one the connection is closed, so whatever the node
            // may still send on it never reaches another client's request.
            if (keep) {
                idle().give(base, std::move(c));
            } else {
                beast::error_code ec;
                c->tcp().socket().shutdown(tcp::socket::shutdown_both, ec);
            }
            return out;
        } catch (const std::exception & e) {
            if (cancel) cancel->attach(-1);
            // A kept connection the node had closed (it restarted, or timed the connection out):
            // try once on a new one, when the node cannot have acted on the request: it was not
            // written, or it reads nothing (GET) and no answer had begun.
            if (reused && !got_head && (!sent || method == "GET")) continue;
            out.error = !cancel->expired() ? std::string(e.what())
                        : out.streamed     ? "the stream sent nothing for " + std::to_string(idle_ms) + " ms"
                                           : "no answer within " + std::to_string(timeout_ms) + " ms";
            out.status = got_head ? out.status : 0;
            if (got_head && !out.streamed) out.status = 0;  // a cut answer is no answer
            return out;
        }
    }
}

}  // namespace armada::gateway

#include "net/http_client.h"

#include "net/http_syntax.h"
#include "net/tls.h"
#include "net/url.h"

#include <openssl/ssl.h>
#include <strings.h>
#include <sys/socket.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

namespace armada::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

void CancelToken::cancel() {
    std::lock_guard lk(mu_);
    cancelled_ = true;
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool CancelToken::cancelled() {
    std::lock_guard lk(mu_);
    return cancelled_;
}

void CancelToken::attach(int fd) {
    std::lock_guard lk(mu_);
    fd_ = fd;
    if (cancelled_ && fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

const std::string * HttpReply::header(std::string_view name) const {
    for (const auto & [k, v] : headers) {
        if (k.size() == name.size() && strncasecmp(k.data(), name.data(), k.size()) == 0) return &v;
    }
    return nullptr;
}

bool dropped_across_origins(const std::string & header, const std::set<std::string> & sensitive) {
    std::string h = header;
    for (auto & c : h)
        c = char(std::tolower(static_cast<unsigned char>(c)));
    return h == "authorization" || h == "cookie" || h == "proxy-authorization" || sensitive.count(h) > 0;
}

namespace {

//! A connection: plain TCP, or TLS over it. A blocking call's connection brings the context it
//! runs on, so it can be kept and used again by another call.
struct Conn {
    std::unique_ptr<asio::io_context> own;
    std::unique_ptr<beast::tcp_stream> plain;
    std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure;
    bool open = false;

    beast::tcp_stream & tcp() { return secure ? secure->next_layer() : *plain; }
    void close() {
        beast::error_code ignored;
        tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
        tcp().socket().close(ignored);
    }
};

std::unique_ptr<Conn> new_conn(const asio::any_io_executor & ex, std::unique_ptr<asio::io_context> own, const Url & u,
                               asio::ssl::context * tls) {
    auto c = std::make_unique<Conn>();
    c->own = std::move(own);
    const auto on = c->own ? asio::any_io_executor(c->own->get_executor()) : ex;
    if (u.scheme == "https") {
        c->secure = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(on, *tls);
        expect_peer_name(c->secure->native_handle(), u.host);
    } else {
        c->plain = std::make_unique<beast::tcp_stream>(on);
    }
    return c;
}

//! Idle kept-alive connections of blocking calls, by origin and TLS context.
class Pool {
  public:
    //! A kept connection the server has not closed, or null. One it closed (a restart, its idle
    //! timeout) would take the request and answer nothing; the request would then count as sent.
    std::unique_ptr<Conn> take(const std::string & key) {
        std::lock_guard lk(mu_);
        auto & v = idle_[key];
        while (!v.empty()) {
            auto c = std::move(v.back());
            v.pop_back();
            char b;
            const ssize_t n = ::recv(c->tcp().socket().native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return c;  // open, and quiet
        }
        return nullptr;
    }
    void give(const std::string & key, std::unique_ptr<Conn> c) {
        std::lock_guard lk(mu_);
        auto & v = idle_[key];
        if (v.size() < 64) v.push_back(std::move(c));
    }

  private:
    std::mutex mu_;
    std::map<std::string, std::vector<std::unique_ptr<Conn>>> idle_;
};

Pool & pool() {
    static auto * p = new Pool();  // never destroyed: a detached thread may still give it a connection
    return *p;
}

std::string pool_key(const Url & u, const asio::ssl::context * tls) {
    return u.scheme + "://" + u.host + ":" + u.port + "#" + std::to_string(reinterpret_cast<uintptr_t>(tls));
}

//! One request and its answer on one connection (opened first when it is not).
class Hop : public std::enable_shared_from_this<Hop> {
  public:
    using Done = std::function<void(HttpReply, bool keep)>;

    Hop(asio::any_io_executor ex, Conn & conn, Url url, http::request<http::string_body> & req, const HttpOptions & opt,
        Clock::time_point deadline, Done done)
        : conn_(conn),
          url_(std::move(url)),
          req_(req),
          opt_(opt),
          deadline_(deadline),
          resolver_(ex),
          timer_(ex),
          done_(std::move(done)) {}

    void start() {
        out_.url = url_.scheme + "://" + host_header(url_) + url_.target;
        arm(deadline_, HttpFailure::timeout);
        if (conn_.open) {
            out_.connected = true;
            attach();
            return write();
        }
        // An address needs no lookup, and so no resolver thread (Asio starts one per context
        // that resolves: one per kept connection of a blocking call).
        beast::error_code bad;
        const auto literal = asio::ip::make_address(url_.host, bad);
        const unsigned long port = std::strtoul(url_.port.c_str(), nullptr, 10);
        if (!bad && port <= 65535) return admit_and_connect({tcp::endpoint(literal, uint16_t(port))});
        resolver_.async_resolve(url_.host, url_.port,
                                [self = shared_from_this()](beast::error_code ec, tcp::resolver::results_type rs) {
                                    self->on_resolve(ec, rs);
                                });
    }

    //! Ends the call now (the blocking caller's `stop` was set).
    void abort() {
        if (finished_) return;
        why_ = HttpFailure::cancelled;
        interrupt();
    }

    bool got_head() const { return got_head_; }
    bool sent() const { return out_.sent; }

  private:
    template <class F>
    void with_stream(F && f) {
        if (conn_.secure)
            f(*conn_.secure);
        else
            f(*conn_.plain);
    }

    void attach() {
        if (opt_.cancel) opt_.cancel->attach(conn_.tcp().socket().native_handle());
    }

    //! The timer ends whatever is in progress when it fires; `why` says what that means.
    //! A wait that expired just as it was re-armed still runs its handler, without an error: the
    //! generation tells it that it no longer counts.
    void arm(Clock::time_point at, HttpFailure why) {
        const uint64_t gen = ++timer_gen_;
        timer_.expires_at(at);
        timer_.async_wait([self = shared_from_this(), gen, why](beast::error_code ec) {
            if (ec || self->finished_ || gen != self->timer_gen_) return;
            self->why_ = why;
            self->interrupt();
        });
    }

    void interrupt() {
        resolver_.cancel();
        beast::error_code ignored;
        // Cancel and shut down, but not close: a CancelToken may still name this descriptor.
        conn_.tcp().socket().cancel(ignored);
        conn_.tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
    }

    //! True (and the call failed) when the timer, a cancel or `stop` ended the call while the
    //! step that just finished was in progress: a lookup or a connect that succeeded late must
    //! not start the next step with no deadline left.
    bool interrupted() {
        if (why_ == HttpFailure::none) return false;
        fail(why_, {});
        return true;
    }

    void on_resolve(beast::error_code ec, const tcp::resolver::results_type & rs) {
        if (interrupted()) return;
        if (ec) return fail(HttpFailure::resolve, "cannot resolve " + url_.host + ": " + ec.message());
        std::vector<tcp::endpoint> all;
        for (const auto & e : rs)
            all.push_back(e.endpoint());
        admit_and_connect(all);
    }

    void admit_and_connect(const std::vector<tcp::endpoint> & all) {
        std::vector<tcp::endpoint> ok;
        std::string denied;
        for (const auto & e : all) {
            const std::string why = opt_.admit ? opt_.admit(e.address()) : std::string();
            if (why.empty())
                ok.push_back(e);
            else
                denied = why;
        }
        if (ok.empty()) return fail(HttpFailure::blocked, "blocked: " + denied);
        // The addresses in turn, and none after an interrupt: a cancelled attempt counts as one
        // that failed, and the next would start with no deadline.
        conn_.tcp().async_connect(
            ok,
            [self = shared_from_this()](const beast::error_code &, const tcp::endpoint &) {
                return self->why_ == HttpFailure::none;
            },
            [self = shared_from_this()](beast::error_code e, const tcp::endpoint &) { self->on_connect(e); });
    }

    void on_connect(beast::error_code ec) {
        if (interrupted()) return;
        if (ec) return fail(HttpFailure::connect, "cannot connect to " + host_header(url_) + ": " + ec.message());
        attach();
        if (!conn_.secure) return opened();
        conn_.secure->async_handshake(asio::ssl::stream_base::client,
                                      [self = shared_from_this()](beast::error_code e) { self->on_handshake(e); });
    }

    void on_handshake(beast::error_code ec) {
        if (interrupted()) return;
        if (!ec) return opened();
        SSL * ssl = conn_.secure->native_handle();
        // A certificate that does not verify will not verify on the next attempt either.
        const bool refused =
            ec.category() == asio::error::get_ssl_category() || SSL_get_verify_result(ssl) != X509_V_OK;
        fail(refused ? HttpFailure::tls_refused : HttpFailure::tls, tls_failure(ec, ssl, url_.host, opt_.ca_setting));
    }

    void opened() {
        conn_.open = true;
        out_.connected = true;
        write();
    }

    void write() {
        // Asked again just before the bytes go: a process stopped (SIGSTOP, starved) since the
        // call began wakes with its permission maybe gone.
        if (opt_.may_send && !opt_.may_send())
            return fail(HttpFailure::not_sent, "not sent: the caller no longer allows it");
        with_stream([&](auto & s) {
            http::async_write(s, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
                if (self->interrupted()) return;
                if (ec) return self->fail(HttpFailure::send, "cannot send the request: " + ec.message());
                self->out_.sent = true;
                // A stream whose head comes with its first message (etcd's) may wait for it.
                if (self->opt_.head_may_wait) self->disarm();
                self->read_head();
            });
        });
    }

    void read_head() {
        // Not boost::none: Boost 1.74 compares a Content-Length against an empty limit as "over".
        parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
        if (req_.method() == http::verb::head) parser_.skip(true);  // the head of an answer without its body
        with_stream([&](auto & s) {
            http::async_read_header(s, buf_, parser_,
                                    [self = shared_from_this()](beast::error_code ec, size_t) { self->on_head(ec); });
        });
    }

    void on_head(beast::error_code ec) {
        if (interrupted()) return;
        if (ec) return fail(HttpFailure::read, "no answer: " + ec.message());
        got_head_ = true;
        const auto & h = parser_.get();
        out_.status = int(h.result_int());
        for (const auto & f : h)
            out_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
        // A redirect the call follows is read and dropped here, never offered as an answer.
        const bool followed =
            opt_.max_redirects > 0 && out_.status >= 300 && out_.status < 400 && out_.header("location");
        out_.streamed = !followed && opt_.on_head && opt_.on_chunk && opt_.on_head(out_);
        if (out_.streamed) {
            // A stream may be quiet for long, unless the caller says how long is too long.
            if (opt_.idle_ms > 0)
                arm(Clock::now() + std::chrono::milliseconds(opt_.idle_ms), HttpFailure::idle);
            else
                disarm();
        }
        if (parser_.is_done()) return finish();
        read_body();
    }

    void read_body() {
        parser_.get().body().data = chunk_;
        parser_.get().body().size = sizeof chunk_;
        with_stream([&](auto & s) {
            http::async_read_some(s, buf_, parser_,
                                  [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
        });
    }

    void on_body(beast::error_code ec) {
        if (interrupted()) return;
        if (ec == http::error::need_buffer) ec = {};
        const size_t n = sizeof chunk_ - parser_.get().body().size;
        if (ec && (ec == http::error::end_of_stream || ec == asio::ssl::error::stream_truncated)) {
            // A body that runs to the end of the connection ends here (a TLS peer may close
            // without close_notify).
            beast::error_code eof;
            parser_.put_eof(eof);
            ec = parser_.is_done() ? beast::error_code() : ec;
        }
        if (ec) return fail(HttpFailure::read, "the answer broke off: " + ec.message());
        if (n > 0) {
            if (out_.streamed) {
                if (!opt_.on_chunk(std::string_view(chunk_, n))) return finish(false);
                if (opt_.idle_ms > 0) arm(Clock::now() + std::chrono::milliseconds(opt_.idle_ms), HttpFailure::idle);
            } else {
                out_.body.append(chunk_, n);
                if (out_.body.size() > opt_.max_body) {
                    if (!opt_.cut_body)
                        return fail(HttpFailure::too_large,
                                    "the answer is larger than " + std::to_string(opt_.max_body) + " bytes");
                    out_.body.resize(size_t(opt_.max_body));
                    out_.truncated = true;
                    return finish(false);
                }
            }
        }
        if (parser_.is_done()) return finish();
        read_body();
    }

    //! The answer is in (or the caller stopped reading it: `whole` false).
    void finish(bool whole = true) {
        if (finished_) return;
        // A whole 2xx answer on a connection both sides keep may serve the next request, when
        // nothing more came after it (in the buffer, or held inside TLS).
        bool drained = buf_.size() == 0;
        if (conn_.secure) {
            SSL * ssl = conn_.secure->native_handle();
            drained = drained && SSL_pending(ssl) == 0 && BIO_ctrl_pending(SSL_get_rbio(ssl)) == 0;
        }
        const bool keep = whole && drained && !out_.streamed && parser_.keep_alive() && opt_.reuse &&
                          out_.status >= 200 && out_.status < 300;
        end(keep);
    }

    void fail(HttpFailure f, std::string why) {
        if (finished_) return;
        // Whatever operation the timer or a cancel interrupted, say what ended it.
        if (why_ == HttpFailure::timeout) {
            f = HttpFailure::timeout;
            why = "no answer within " + std::to_string(opt_.timeout_ms) + " ms";
        } else if (why_ == HttpFailure::idle) {
            f = HttpFailure::idle;
            why = "the stream sent nothing for " + std::to_string(opt_.idle_ms) + " ms";
        } else if (why_ == HttpFailure::cancelled || (opt_.cancel && opt_.cancel->cancelled())) {
            f = HttpFailure::cancelled;
            why = "cancelled";
        }
        out_.failure = f;
        out_.error = std::move(why);
        if (!out_.streamed) out_.status = 0;  // a cut answer is no answer
        end(false);
    }

    void disarm() {
        ++timer_gen_;
        timer_.cancel();
    }

    void end(bool keep) {
        finished_ = true;
        disarm();
        if (opt_.cancel) opt_.cancel->attach(-1);
        auto done = std::move(done_);
        done(std::move(out_), keep);
    }

    Conn & conn_;
    Url url_;
    http::request<http::string_body> & req_;
    const HttpOptions & opt_;
    Clock::time_point deadline_;
    tcp::resolver resolver_;
    asio::steady_timer timer_;
    Done done_;
    HttpReply out_;
    http::response_parser<http::buffer_body> parser_;
    beast::flat_buffer buf_;
    char chunk_[16384];
    HttpFailure why_ = HttpFailure::none;
    uint64_t timer_gen_ = 0;
    bool finished_ = false, got_head_ = false;
};

//! Headers a caller may not set: the client frames the request itself, and a caller's framing
//! could make the server read the body, or the next request, differently from how it is written.
bool framing_header(const std::string & k) {
    for (const char * h : {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
                           "upgrade", "proxy-connection", "expect"}) {
        if (strcasecmp(k.c_str(), h) == 0) return true;
    }
    return false;
}

//! Where a call stands across its redirects.
struct Route {
    Url first, at;
    std::string method;
    bool cross = false;         // a redirect left the first origin
    bool body_dropped = false;  // a redirect turned the request into a GET
    int redirects = 0;
};

//! A host as it goes into the Host header: visible ASCII, no space, nothing that ends the
//! authority (a URL's host comes from its caller, and a tool's URL may come from a tenant).
bool host_ok(const Url & u) {
    for (unsigned char c : u.host) {
        if (c <= 0x20 || c >= 0x7f || c == '/' || c == '?' || c == '#' || c == '@') return false;
    }
    for (unsigned char c : u.port) {
        if (c < '0' || c > '9') return false;
    }
    return !u.port.empty() && u.port.size() <= 5;
}

//! Checks what the request would put on the wire; empty when all of it may go.
std::string unclean(const HttpRequest & r, const Url & u) {
    if (!host_ok(u)) return "the host";
    if (!header_name_ok(r.method)) return "the method";
    if (!target_ok(u.target)) return "the target";
    for (const auto & [k, v] : r.headers) {
        if (!header_name_ok(k) || !header_value_ok(v)) return "header '" + k + "'";
    }
    return {};
}

//! The request for the route's current hop.
http::request<http::string_body> build(const HttpRequest & r, const Route & route, const HttpOptions & opt) {
    http::request<http::string_body> req;
    req.version(11);
    if (const auto v = http::string_to_verb(route.method); v != http::verb::unknown)
        req.method(v);
    else
        req.method_string(route.method);
    req.target(route.at.target);
    if (!opt.user_agent.empty()) req.set(http::field::user_agent, opt.user_agent);
    for (const auto & [k, v] : r.headers) {
        if (framing_header(k)) continue;
        // Once a redirect leaves the first origin, credentials stay behind, as in browsers.
        if (route.cross && dropped_across_origins(k, opt.sensitive)) continue;
        req.set(k, v);
    }
    req.set(http::field::host, host_header(route.at));
    // No Connection header: HTTP/1.1 keeps the connection by default, and a call that does not
    // reuse it closes it once the answer is in. (A `Connection: close` here would be passed on by
    // proxies that keep their own upstream connection, and some servers then answer 400.)
    const bool bodiless = route.method == "GET" || route.method == "HEAD";
    if (!route.body_dropped && (!r.body.empty() || !bodiless)) {
        req.body() = r.body;
        req.prepare_payload();
    }
    return req;
}

//! Starts a route at `r.url`; false (with `out` saying why) when the call cannot begin.
bool begin(const HttpRequest & r, const HttpOptions & opt, Route & route, HttpReply & out) {
    if (!parse_url(r.url, route.first)) {
        out.failure = HttpFailure::bad_request;
        out.error = "not a valid http:// or https:// URL: " + r.url;
        return false;
    }
    route.at = route.first;
    route.method = r.method;
    if (const auto bad = unclean(r, route.at); !bad.empty()) {
        out.failure = HttpFailure::bad_request;
        out.error = bad + " holds bytes a request may not carry; nothing was sent";
        return false;
    }
    return true;
}

//! Whether `r` sends the route on to another URL. Fails `r` when the redirect cannot be taken.
bool redirected(Route & route, const HttpOptions & opt, HttpReply & r) {
    if (!r.error.empty() || opt.max_redirects <= 0 || r.status < 300 || r.status >= 400) return false;
    const std::string * loc = r.header("location");
    if (!loc) return false;
    const std::string next = resolve_location(route.at, *loc);
    Url to;
    if (++route.redirects > opt.max_redirects) {
        r.failure = HttpFailure::redirects;
        r.error = "more than " + std::to_string(opt.max_redirects) + " redirects";
        return false;
    }
    if (!parse_url(next, to) || !target_ok(to.target) || !host_ok(to)) {
        r.failure = HttpFailure::redirects;
        r.error = "a redirect to an invalid URL: " + *loc;
        return false;
    }
    if (!same_origin(route.first, to)) route.cross = true;
    // As curl and browsers do: 301, 302 and 303 go on as a GET; 307 and 308 repeat the request.
    if (r.status == 301 || r.status == 302 || r.status == 303) {
        route.method = "GET";
        route.body_dropped = true;
    }
    route.at = to;  // resolved and admitted again, so a redirect cannot reach a refused address
    return true;
}

bool tls_missing(const Route & route, const HttpOptions & opt, HttpReply & out) {
    if (route.at.scheme != "https" || opt.tls) return false;
    out.failure = HttpFailure::no_tls;
    out.error = "https needs TLS, which is off";
    return true;
}

//! One asynchronous call across its redirects. Keeps itself alive through its handlers.
class AsyncCall : public std::enable_shared_from_this<AsyncCall> {
  public:
    AsyncCall(asio::any_io_executor io, HttpRequest r, HttpOptions opt, std::function<void(HttpReply)> done)
        : io_(asio::make_strand(io)), r_(std::move(r)), opt_(std::move(opt)), done_(std::move(done)) {
        opt_.reuse = false;
        opt_.stop = nullptr;
    }

    void begin_call() {
        asio::dispatch(io_, [self = shared_from_this()] {
            HttpReply out;
            if (!begin(self->r_, self->opt_, self->route_, out)) return self->done_(std::move(out));
            self->deadline_ = Clock::now() + std::chrono::milliseconds(self->opt_.timeout_ms);
            self->hop();
        });
    }

  private:
    void hop() {
        HttpReply out;
        if (tls_missing(route_, opt_, out)) return done_(std::move(out));
        conn_ = new_conn(io_, nullptr, route_.at, opt_.tls);
        req_ = build(r_, route_, opt_);
        auto h = std::make_shared<Hop>(
            io_, *conn_, route_.at, req_, opt_, deadline_, [self = shared_from_this()](HttpReply rep, bool) {
                // The hop's handlers may still be on the stack: close after.
                asio::post(self->io_, [self, rep = std::move(rep)]() mutable { self->hop_done(std::move(rep)); });
            });
        hop_ = h;
        h->start();
    }

    void hop_done(HttpReply rep) {
        conn_->close();
        if (redirected(route_, opt_, rep)) return hop();
        done_(std::move(rep));
    }

    // The I/O threads run many handlers at once. A strand runs this call's one at a time: without
    // it, the deadline (which shuts the socket) could fire on one thread while a read finishes on
    // another.
    asio::any_io_executor io_;
    HttpRequest r_;
    HttpOptions opt_;
    std::function<void(HttpReply)> done_;
    Route route_;
    Clock::time_point deadline_;
    std::unique_ptr<Conn> conn_;
    http::request<http::string_body> req_;
    std::shared_ptr<Hop> hop_;
};

//! Runs `hop` on `ioc` to its end; `stop` (when given) ends it early.
void run_hop(asio::io_context & ioc, Hop & hop, const bool & finished, const std::atomic<bool> * stop) {
    if (!stop) {
        ioc.run();
    } else {
        bool stopping = false;
        while (!finished && !ioc.stopped()) {
            ioc.run_for(std::chrono::milliseconds(100));
            if (!stopping && stop->load()) {
                stopping = true;
                hop.abort();
            }
        }
        ioc.run();  // what the abort left to finish
    }
    ioc.restart();
}

}  // namespace

HttpReply http_call(const HttpRequest & r, const HttpOptions & opt_in) {
    // A kept connection skips resolving, so it would skip `admit` too: a call whose addresses are
    // checked always opens its own.
    HttpOptions unpooled;
    if (opt_in.reuse && opt_in.admit) {
        unpooled = opt_in;
        unpooled.reuse = false;
    }
    const HttpOptions & opt = opt_in.reuse && opt_in.admit ? unpooled : opt_in;
    HttpReply out;
    Route route;
    if (!begin(r, opt, route, out)) return out;
    const auto deadline = Clock::now() + std::chrono::milliseconds(opt.timeout_ms);
    for (;;) {
        if (tls_missing(route, opt, out)) return out;
        auto req = build(r, route, opt);
        const std::string key = pool_key(route.at, opt.tls);
        bool keep = false;
        std::unique_ptr<Conn> conn;
        for (int attempt = 0;; ++attempt) {
            conn = opt.reuse && attempt == 0 ? pool().take(key) : nullptr;
            const bool reused = conn != nullptr;
            if (!conn) conn = new_conn({}, std::make_unique<asio::io_context>(), route.at, opt.tls);
            bool finished = false;
            auto hop = std::make_shared<Hop>(conn->own->get_executor(), *conn, route.at, req, opt, deadline,
                                             [&](HttpReply rep, bool k) {
                                                 out = std::move(rep);
                                                 keep = k;
                                                 finished = true;
                                             });
            hop->start();
            run_hop(*conn->own, *hop, finished, opt.stop);
            // A kept connection the server had closed: once more on a new one, when the server
            // cannot have acted on the request (it was not written, or it only reads, GET) and no
            // answer had begun.
            if (reused && !out.error.empty() && out.failure != HttpFailure::timeout &&
                out.failure != HttpFailure::cancelled && !hop->got_head() && (!hop->sent() || route.method == "GET"))
                continue;
            break;
        }
        if (keep && opt.reuse)
            pool().give(key, std::move(conn));
        else
            conn->close();
        if (!redirected(route, opt, out)) return out;
    }
}

void http_call_async(asio::any_io_executor io, HttpRequest request, HttpOptions options,
                     std::function<void(HttpReply)> done) {
    std::make_shared<AsyncCall>(std::move(io), std::move(request), std::move(options), std::move(done))->begin_call();
}

Download http_download(const std::string & url, const HeaderList & headers, const std::string & path,
                       const DownloadOptions & o) {
    Download d;
    int fd = -1;
    std::string refused;  // the start of a reply other than 200
    HttpOptions opt;
    opt.timeout_ms = o.connect_timeout_ms;
    opt.idle_ms = o.idle_timeout_ms;
    opt.tls = o.tls;
    opt.admit = o.admit;
    // The body always streams, so a refused or unwanted one is never held in memory: the chunk
    // callback stops it.
    opt.on_head = [&](const HttpReply & head) {
        d.status = head.status;
        d.headers = head.headers;
        if (head.status != 200) return true;
        if (const auto * len = head.header("content-length");
            len && std::strtoull(len->c_str(), nullptr, 10) > o.max_bytes)
            d.error = "the body is larger than " + std::to_string(o.max_bytes) + " bytes";
        if (o.check && d.error.empty()) d.error = o.check(head.status, head.headers);
        if (!d.error.empty()) return true;
        fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) d.error = std::string("cannot create ") + path + ": " + std::strerror(errno);
        return true;
    };
    opt.on_chunk = [&](std::string_view piece) {
        if (!d.error.empty()) return false;
        if (fd < 0) {
            refused.append(piece.substr(0, 300 - std::min<size_t>(300, refused.size())));
            return refused.size() < 300;
        }
        if (d.bytes + piece.size() > o.max_bytes) {
            d.error = "the body is larger than " + std::to_string(o.max_bytes) + " bytes";
            return false;
        }
        for (size_t at = 0; at < piece.size();) {
            const ssize_t w = ::write(fd, piece.data() + at, piece.size() - at);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                d.error = std::string("cannot write ") + path + ": " + std::strerror(errno);
                return false;
            }
            at += size_t(w);
        }
        d.bytes += piece.size();
        return true;
    };
    HttpRequest r;
    r.url = url;
    r.headers = headers;
    const HttpReply rep = http_call(r, opt);
    if (fd >= 0) ::close(fd);
    if (!d.error.empty()) return d;
    if (!rep.error.empty()) {
        d.error = (rep.failure == HttpFailure::read || rep.failure == HttpFailure::idle) && rep.streamed
                      ? "the transfer broke off after " + std::to_string(d.bytes) + " bytes: " + rep.error
                      : rep.error;
        return d;
    }
    if (d.status != 200) {
        d.error = "HTTP " + std::to_string(d.status) + (refused.empty() ? std::string() : ": " + refused);
    } else if (!rep.streamed) {
        d.error = "the transfer ended early";
    }
    return d;
}

}  // namespace armada::net

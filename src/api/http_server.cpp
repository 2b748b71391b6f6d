#include "api/http_server.h"

#include <spdlog/spdlog.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <sys/resource.h>
#include <sys/socket.h>

#include <cerrno>

#include <deque>
#include <map>
#include <mutex>
#include <optional>

namespace armada::api {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

std::string lower(std::string s) {
    for (auto & c : s)
        c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

//! Open connections by client address (HttpConfig::max_connections_per_client).
struct HttpServer::PerClient {
    std::mutex mu;
    std::map<std::string, size_t> open;
    //! Takes a slot for `addr`; false when it holds `cap` already.
    bool take(const std::string & addr, size_t cap) {
        std::lock_guard lk(mu);
        auto & n = open[addr];
        if (cap > 0 && n >= cap) return false;
        ++n;
        return true;
    }
    void give(const std::string & addr) {
        std::lock_guard lk(mu);
        auto it = open.find(addr);
        if (it == open.end()) return;
        if (--it->second == 0) open.erase(it);
    }
};

namespace {

//! Answers a connection the server will not take (`status_line` e.g. "503 Service Unavailable")
//! with an OpenAI-shaped error and Retry-After: 1, and closes it, keeping no state for it. The
//! reply is small enough for a fresh socket's send buffer, so the blocking write returns.
void refuse_and_close(tcp::socket & sock, const std::string & status_line, const char * type, const char * code,
                      const char * message) {
    const std::string body = std::string(R"({"error":{"message":")") + message + R"(","type":")" + type +
                             R"(","param":null,"code":")" + code + R"("}})";
    const std::string reply = "HTTP/1.1 " + status_line +
                              "\r\nServer: armada\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                              "Connection: close\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
    beast::error_code ec;
    net::write(sock, net::buffer(reply), ec);
    sock.shutdown(tcp::socket::shutdown_both, ec);
    sock.close(ec);
}

//! Holds a connection's slot among its client's until the connection is freed.
struct ClientSlot {
    std::shared_ptr<HttpServer::PerClient> table;
    std::string addr;
    ClientSlot(std::shared_ptr<HttpServer::PerClient> t, std::string a) : table(std::move(t)), addr(std::move(a)) {}
    ClientSlot(const ClientSlot &) = delete;
    ClientSlot & operator=(const ClientSlot &) = delete;
    ~ClientSlot() {
        if (table) table->give(addr);
    }
};

//! What every connection shares with the server.
struct Shared {
    const HttpConfig & cfg;
    const Handler & handler;
    std::atomic<size_t> & count;
    std::atomic<size_t> & exchanges;
    const std::atomic<bool> & closing;  // answer with Connection: close (draining)
};

//! The reply side of a connection, whatever its stream; `Reply` holds one.
class Conn {
  public:
    virtual ~Conn() = default;
    virtual void send(unsigned status, const std::string & type, std::string body, const Headers & extra) = 0;
    virtual void start_stream(unsigned status, const Headers & extra) = 0;
    virtual void write(std::string chunk) = 0;
    virtual void end() = 0;
    virtual bool closed() const = 0;
    virtual void on_close(std::function<void()> fn) = 0;
    virtual void long_lived() = 0;
    virtual net::any_io_executor executor() = 0;
    virtual void abort() = 0;
    // A stream's bytes not yet sent (Responder::backlog); changed on the connection's strand
    // except `in_flight_`, which a Responder's `write` adds to before posting.
    std::atomic<size_t> queued_{0};     // in the stream's queue
    std::atomic<size_t> in_flight_{0};  // posted to `write`, not yet queued
};

std::shared_ptr<Responder> make_reply(std::shared_ptr<Conn> c);

//! One connection, over plain TCP or TLS. Lives as long as an operation or a Responder
//! references it.
template <class Stream>
class Session : public Conn, public std::enable_shared_from_this<Session<Stream>> {
  public:
    template <class... Args>
    Session(const Shared & shared, std::unique_ptr<ClientSlot> slot, Args &&... args)
        : slot_(std::move(slot)),
          stream_(std::forward<Args>(args)...),
          cfg_(shared.cfg),
          handler_(shared.handler),
          count_(shared.count),
          exchanges_(shared.exchanges),
          closing_(shared.closing) {
        count_++;
    }
    ~Session() override {
        exchange_done();
        count_--;
    }

    void long_lived() override {
        exchange_done();
        if (cfg_.heartbeat_ms > 0 && streaming_) heartbeat(req_gen_);
    }

    void start() {
        net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
            if constexpr (kTls) {
                // A client that connects and never says hello is dropped like an idle one.
                const int hello_s = self->cfg_.header_timeout_s > 0
                                        ? std::min(self->cfg_.idle_timeout_s, self->cfg_.header_timeout_s)
                                        : std::min(self->cfg_.idle_timeout_s, 30);
                self->tcp().expires_after(std::chrono::seconds(hello_s));
                self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
                    if (ec) return self->fail();
                    self->read();
                });
            } else {
                self->read();
            }
        });
    }

    // --- called through Reply, always on the strand ---
    void send(unsigned status, const std::string & type, std::string body, const Headers & extra) override {
        if (replied_ || closed_) return;
        replied_ = true;
        if (closing_.load()) keep_alive_ = false;
        auto res = std::make_shared<http::response<http::string_body>>(http::status(status), 11);
        res->set(http::field::server, "armada");
        res->set(http::field::content_type, type);
        for (const auto & [k, v] : extra)
            res->set(k, v);
        res->body() = std::move(body);
        res->keep_alive(keep_alive_);
        res->prepare_payload();
        tcp().expires_never();
        http::async_write(stream_, *res, [self = this->shared_from_this(), res](beast::error_code ec, size_t) {
            self->after_response(ec);
        });
    }

    void start_stream(unsigned status, const Headers & extra) override {
        if (replied_ || closed_) return;
        replied_ = true;
        streaming_ = true;
        if (closing_.load()) keep_alive_ = false;
        auto res = std::make_shared<http::response<http::empty_body>>(http::status(status), 11);
        res->set(http::field::server, "armada");
        res->set(http::field::content_type, "text/event-stream");
        res->set(http::field::cache_control, "no-cache");
        for (const auto & [k, v] : extra)
            res->set(k, v);
        res->keep_alive(keep_alive_);
        res->chunked(true);
        auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*res);
        writing_ = true;
        tcp().expires_never();
        http::async_write_header(stream_, *sr,
                                 [self = this->shared_from_this(), res, sr](beast::error_code ec, size_t) {
                                     self->writing_ = false;
                                     if (ec) return self->fail();
                                     self->pump();
                                 });
    }

    void write(std::string chunk) override {
        in_flight_ -= chunk.size();
        if (!streaming_ || closed_ || ended_) return;
        wrote_ = true;
        queued_ += chunk.size();
        if (queued_ > cfg_.max_stream_backlog) {
            spdlog::warn("http: a stream's client reads too slowly ({} bytes waiting for it); closing it",
                         queued_.load());
            out_.clear();
            queued_ = 0;
            return fail();
        }
        out_.push_back(std::move(chunk));
        pump();
    }

    void end() override {
        if (!streaming_ || closed_ || ended_) return;
        ended_ = true;
        pump();
    }

    bool closed() const override { return closed_.load(); }

    void on_close(std::function<void()> fn) override {
        if (closed_) {
            fn();
            return;
        }
        close_fns_.push_back(std::move(fn));
        watch_peer();
    }

    // The socket was accepted on a strand, so this executor serialises all work on the session.
    net::any_io_executor executor() override { return stream_.get_executor(); }

  private:
    static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;
    beast::tcp_stream & tcp() { return beast::get_lowest_layer(stream_); }
    void exchange_done() {
        if (in_exchange_) exchanges_--;
        in_exchange_ = false;
    }

    void read() {
        ++req_gen_;
        parser_.emplace();
        parser_->body_limit(cfg_.max_body);
        parser_->header_limit(64 * 1024);
        replied_ = streaming_ = ended_ = false;
        // The first request's head must arrive within header_timeout_s of the accept; a later
        // one's within the idle timeout (the client has been answered once).
        const int head_s = req_gen_ == 1 && cfg_.header_timeout_s > 0
                               ? std::min(cfg_.header_timeout_s, cfg_.idle_timeout_s)
                               : cfg_.idle_timeout_s;
        if (req_gen_ != 1 || !kTls || cfg_.header_timeout_s <= 0) tcp().expires_after(std::chrono::seconds(head_s));
        http::async_read_header(stream_, buf_, *parser_,
                                [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                    if (ec) return self->on_read(ec);
                                    // The body has the idle timeout (a large body over a slow link is no attack).
                                    self->tcp().expires_after(std::chrono::seconds(self->cfg_.idle_timeout_s));
                                    http::async_read(self->stream_, self->buf_, *self->parser_,
                                                     [self](beast::error_code ec2, size_t) { self->on_read(ec2); });
                                });
    }

    void on_read(beast::error_code ec) {
        if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
            ec == net::ssl::error::stream_truncated)
            return fail();
        if (ec == http::error::body_limit) {
            keep_alive_ = false;
            unread_body_ = true;
            return send(413, "application/json",
                        R"({"error":{"message":"request body exceeds the limit of )" + std::to_string(cfg_.max_body) +
                            R"( bytes","type":"invalid_request_error","param":null,"code":"request_too_large"}})",
                        {});
        }
        if (ec) {
            keep_alive_ = false;
            if (ec == net::error::operation_aborted || ec == net::error::connection_reset) return fail();
            return send(400, "application/json",
                        R"({"error":{"message":"malformed HTTP request: )" + ec.message() +
                            R"(","type":"invalid_request_error","param":null,"code":null}})",
                        {});
        }
        auto msg = parser_->release();
        keep_alive_ = msg.keep_alive();
        HttpRequest req;
        req.method = std::string(msg.method_string());
        std::string target(msg.target());
        const auto q = target.find('?');
        req.path = target.substr(0, q);
        if (q != std::string::npos) req.query = target.substr(q + 1);
        for (const auto & f : msg)
            req.headers[lower(std::string(f.name_string()))] = std::string(f.value());
        req.body = std::move(msg.body());
        exchanges_++;
        in_exchange_ = true;
        try {
            handler_(std::move(req), make_reply(this->shared_from_this()));
        } catch (const std::exception & e) {
            spdlog::error("handler threw: {}", e.what());
            send(500, "application/json",
                 R"({"error":{"message":"internal error","type":"server_error","param":null,"code":null}})", {});
        }
    }

    void after_response(beast::error_code ec) {
        exchange_done();
        if (!ec) close_fns_.clear();  // the answer went out whole: nobody hung up on it
        if (!ec && unread_body_) return linger_close();
        if (ec || !keep_alive_) return fail();
        out_.clear();
        finished_ = false;
        close_fns_.clear();
        read();
    }

    // The client may still be sending a body we refused; closing now would reset the connection
    // before it reads our answer. Stop sending, swallow what arrives for a while, then close.
    void linger_close() {
        beast::error_code ec;
        tcp().socket().shutdown(tcp::socket::shutdown_send, ec);
        tcp().expires_after(std::chrono::seconds(5));
        drain_buf_.resize(64 * 1024);
        tcp().async_read_some(net::buffer(drain_buf_),
                              [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                                  self->drained_ += n;
                                  if (ec || self->drained_ > (64u << 20)) return self->fail();
                                  self->linger_close();
                              });
    }

    void pump() {
        if (writing_ || closed_) return;
        if (!out_.empty()) {
            writing_ = true;
            auto chunk = std::make_shared<std::string>(std::move(out_.front()));
            out_.pop_front();
            queued_ -= chunk->size();
            net::async_write(stream_, http::make_chunk(net::buffer(*chunk)),
                             [self = this->shared_from_this(), chunk](beast::error_code ec, size_t) {
                                 self->writing_ = false;
                                 if (ec) return self->fail();
                                 self->pump();
                             });
        } else if (ended_ && !finished_) {
            finished_ = true;
            writing_ = true;
            if (heartbeat_) heartbeat_->cancel();  // its wait holds this session alive
            net::async_write(stream_, http::make_chunk_last(),
                             [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                 self->writing_ = false;
                                 self->after_response(ec);
                             });
        }
    }

    // Notices a peer that hangs up while its request is being worked on. A wait left over from
    // an earlier request on this connection is ignored: its readable bytes belong to the next
    // request, which the pending read consumes.
    void watch_peer() {
        if (watch_gen_ == req_gen_ || closed_) return;
        watch_gen_ = req_gen_;
        tcp().socket().async_wait(
            tcp::socket::wait_read, [self = this->shared_from_this(), gen = req_gen_](beast::error_code ec) {
                if (ec == net::error::operation_aborted || gen != self->req_gen_ || self->finished_request(gen)) return;
                if (ec) return self->fail();
                // A wait may end with nothing to read and the peer still there (Asio's reactor
                // can report a descriptor ready from an earlier edge): only a read of 0 bytes
                // (end of stream) or an error means it hung up. Otherwise the wait starts again.
                char b;
                const ssize_t n = ::recv(self->tcp().socket().native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return self->fail();
                if (n < 0) {
                    self->watch_gen_ = 0;
                    self->watch_peer();
                }
            });
    }

    // Every heartbeat_ms of a long-lived stream: a comment line unless something else went out.
    void heartbeat(uint64_t gen) {
        if (!heartbeat_) heartbeat_.emplace(stream_.get_executor());
        heartbeat_->expires_after(std::chrono::milliseconds(cfg_.heartbeat_ms));
        heartbeat_->async_wait([self = this->shared_from_this(), gen](beast::error_code ec) {
            if (ec || gen != self->req_gen_ || self->closed_ || self->ended_ || !self->streaming_) return;
            if (!self->wrote_) {
                std::string comment = ": keep-alive\n\n";
                self->queued_ += comment.size();
                self->out_.push_back(std::move(comment));
                self->pump();
            }
            self->wrote_ = false;
            self->heartbeat(gen);
        });
    }

    bool finished_request(uint64_t gen) const { return gen != req_gen_ || (replied_ && !streaming_) || finished_; }

    void abort() override { fail(); }

    void fail() {
        exchange_done();
        if (closed_.exchange(true)) return;
        if (heartbeat_) heartbeat_->cancel();  // the connection is freed now, not at the next tick
        beast::error_code ec;
        tcp().socket().shutdown(tcp::socket::shutdown_both, ec);
        tcp().socket().close(ec);
        auto fns = std::move(close_fns_);
        for (auto & fn : fns)
            fn();
    }

    std::unique_ptr<ClientSlot> slot_;  // freed with the session
    Stream stream_;
    const HttpConfig & cfg_;
    const Handler & handler_;
    std::atomic<size_t> & count_;
    std::atomic<size_t> & exchanges_;
    bool in_exchange_ = false;
    const std::atomic<bool> & closing_;
    beast::flat_buffer buf_;
    std::optional<http::request_parser<http::string_body>> parser_;
    bool keep_alive_ = true, replied_ = false, streaming_ = false, ended_ = false, finished_ = false;
    bool writing_ = false, unread_body_ = false;
    uint64_t req_gen_ = 0, watch_gen_ = 0;
    std::vector<char> drain_buf_;
    size_t drained_ = 0;
    std::atomic<bool> closed_{false};
    std::deque<std::string> out_;
    std::vector<std::function<void()>> close_fns_;
    std::optional<net::steady_timer> heartbeat_;
    bool wrote_ = false;  // since the last heartbeat tick
};

//! Responder bound to one request of a connection; posts every call onto the connection's strand.
class Reply : public Responder {
  public:
    explicit Reply(std::shared_ptr<Conn> s) : s_(std::move(s)) {}
    void send(int status, const std::string & type, std::string body, Headers extra) override {
        net::dispatch(s_->executor(), [s = s_, status, type, b = std::move(body), e = std::move(extra)]() mutable {
            s->send(unsigned(status), type, std::move(b), e);
        });
    }
    void start_stream(int status, Headers extra) override {
        net::dispatch(s_->executor(), [s = s_, status, e = std::move(extra)] { s->start_stream(unsigned(status), e); });
    }
    void write(std::string chunk) override {
        s_->in_flight_ += chunk.size();
        net::post(s_->executor(), [s = s_, c = std::move(chunk)]() mutable { s->write(std::move(c)); });
    }
    void end() override {
        net::post(s_->executor(), [s = s_] { s->end(); });
    }
    bool closed() const override { return s_->closed(); }
    void on_close(std::function<void()> fn) override {
        net::dispatch(s_->executor(), [s = s_, f = std::move(fn)]() mutable { s->on_close(std::move(f)); });
    }
    void long_lived() override {
        net::dispatch(s_->executor(), [s = s_] { s->long_lived(); });
    }
    size_t backlog() const override { return s_->in_flight_.load() + s_->queued_.load(); }
    void abort() override {
        net::post(s_->executor(), [s = s_] { s->abort(); });
    }

  private:
    std::shared_ptr<Conn> s_;
};

std::shared_ptr<Responder> make_reply(std::shared_ptr<Conn> c) {
    return std::make_shared<Reply>(std::move(c));
}

}  // namespace

std::string HttpRequest::param(const std::string & name) const {
    size_t i = 0;
    while (i <= query.size()) {
        size_t j = query.find('&', i);
        if (j == std::string::npos) j = query.size();
        const std::string pair = query.substr(i, j - i);
        const auto eq = pair.find('=');
        if (pair.substr(0, eq) == name) {
            const std::string raw = eq == std::string::npos ? "" : pair.substr(eq + 1);
            std::string out;
            for (size_t k = 0; k < raw.size(); ++k) {
                if (raw[k] == '+') {
                    out += ' ';
                } else if (raw[k] == '%' && k + 2 < raw.size() &&
                           std::isxdigit(static_cast<unsigned char>(raw[k + 1])) &&
                           std::isxdigit(static_cast<unsigned char>(raw[k + 2]))) {
                    out += char(std::stoi(raw.substr(k + 1, 2), nullptr, 16));
                    k += 2;
                } else {
                    out += raw[k];
                }
            }
            return out;
        }
        i = j + 1;
    }
    return {};
}

HttpServer::HttpServer(HttpConfig cfg, Handler handler)
    : cfg_(std::move(cfg)),
      handler_(std::move(handler)),
      acceptor_(net::make_strand(ioc_)),
      accept_retry_(acceptor_.get_executor()),
      per_client_(std::make_shared<PerClient>()) {
    max_connections_ = cfg_.max_connections;
    if (max_connections_ == 0) {
        rlimit rl{};
        const size_t fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 65536;
        max_connections_ = fds > 320 ? fds - 256 : 64;
    }
}

HttpServer::~HttpServer() {
    stop();
}

std::string HttpServer::listen() {
    beast::error_code ec;
    if (!cfg_.ssl_cert_file.empty() || !cfg_.ssl_key_file.empty()) {
        if (cfg_.ssl_cert_file.empty() || cfg_.ssl_key_file.empty())
            return "HTTPS needs both --ssl-cert-file and --ssl-key-file";
        tls_ = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
        tls_->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                              net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                              net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use,
                          ec);
        tls_->use_certificate_chain_file(cfg_.ssl_cert_file, ec);
        if (ec) return "--ssl-cert-file " + cfg_.ssl_cert_file + ": " + ec.message();
        tls_->use_private_key_file(cfg_.ssl_key_file, net::ssl::context::pem, ec);
        if (ec) return "--ssl-key-file " + cfg_.ssl_key_file + ": " + ec.message();
    }
    auto addr = net::ip::make_address(cfg_.host, ec);
    if (ec) return "invalid --host '" + cfg_.host + "': " + ec.message();
    tcp::endpoint ep(addr, cfg_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return "cannot listen on " + cfg_.host + ":" + std::to_string(cfg_.port) + ": " + ec.message();
    port_ = acceptor_.local_endpoint().port();
    accept();
    return {};
}

void HttpServer::accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket sock) {
        if (ec == net::error::operation_aborted) return;
        if (ec) {
            // Out of file descriptors (or similar): retrying at once would spin on the strand.
            // Wait a little; connections that close meanwhile make room.
            const auto now = std::chrono::steady_clock::now();
            if (now - last_accept_warning_ > std::chrono::seconds(10)) {
                spdlog::warn("accept failed: {}; retrying (open connections: {})", ec.message(), connections_.load());
                last_accept_warning_ = now;
            }
            accept_retry_.expires_after(std::chrono::milliseconds(50));
            accept_retry_.async_wait([this](beast::error_code e) {
                if (!e) accept();
            });
            return;
        }
        if (connections_.load() >= max_connections_) {
            // Full: say so and close.
            refuse_and_close(sock, "503 Service Unavailable", "service_unavailable_error", "overloaded",
                             "the server has too many open connections; retry shortly");
            return accept();
        }
        std::unique_ptr<ClientSlot> slot;
        if (cfg_.max_connections_per_client > 0) {
            const auto peer = sock.remote_endpoint(ec);
            const std::string addr = ec ? std::string() : peer.address().to_string();
            if (!per_client_->take(addr, cfg_.max_connections_per_client)) {
                // One client holds its share of the connections: it hears so, and others still
                // get in.
                refuse_and_close(sock, "429 Too Many Requests", "rate_limit_error", "too_many_connections",
                                 "this client has too many open connections; close some or retry shortly");
                return accept();
            }
            slot = std::make_unique<ClientSlot>(per_client_, addr);
        }
        sock.set_option(tcp::no_delay(true), ec);
        const Shared shared{cfg_, handler_, connections_, exchanges_, closing_};
        if (tls_)
            std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(shared, std::move(slot), std::move(sock),
                                                                            *tls_)
                ->start();
        else
            std::make_shared<Session<beast::tcp_stream>>(shared, std::move(slot), std::move(sock))->start();
        accept();
    });
}

void HttpServer::run() {
    for (int i = 0; i < std::max(1, cfg_.threads); ++i)
        threads_.emplace_back([this] { ioc_.run(); });
}

void HttpServer::stop() {
    net::post(acceptor_.get_executor(), [this] {
        beast::error_code ec;
        acceptor_.close(ec);
        accept_retry_.cancel();
    });
    ioc_.stop();
    for (auto & t : threads_) {
        if (t.joinable()) t.join();
    }
    threads_.clear();
}

}  // namespace armada::api

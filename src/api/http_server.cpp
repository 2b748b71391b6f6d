#include "api/http_server.h"

#include <spdlog/spdlog.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/resource.h>

#include <deque>
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

//! One TCP connection. Lives as long as an operation or a Responder references it.
class Session : public std::enable_shared_from_this<Session> {
  public:
    Session(tcp::socket && sock, const HttpConfig & cfg, const Handler & handler, std::atomic<size_t> & count)
        : stream_(std::move(sock)), cfg_(cfg), handler_(handler), count_(count) {
        count_++;
    }
    ~Session() { count_--; }

    void start() {
        net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
    }

    // --- called through Reply, always on the strand ---
    void send(unsigned status, const std::string & type, std::string body, const Headers & extra) {
        if (replied_ || closed_) return;
        replied_ = true;
        auto res = std::make_shared<http::response<http::string_body>>(http::status(status), 11);
        res->set(http::field::server, "armada");
        res->set(http::field::content_type, type);
        for (const auto & [k, v] : extra)
            res->set(k, v);
        res->body() = std::move(body);
        res->keep_alive(keep_alive_);
        res->prepare_payload();
        stream_.expires_never();
        http::async_write(stream_, *res,
                          [self = shared_from_this(), res](beast::error_code ec, size_t) { self->after_response(ec); });
    }

    void start_stream(unsigned status, const Headers & extra) {
        if (replied_ || closed_) return;
        replied_ = true;
        streaming_ = true;
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
        stream_.expires_never();
        http::async_write_header(stream_, *sr, [self = shared_from_this(), res, sr](beast::error_code ec, size_t) {
            self->writing_ = false;
            if (ec) return self->fail();
            self->pump();
        });
    }

    void write(std::string chunk) {
        if (!streaming_ || closed_ || ended_) return;
        out_.push_back(std::move(chunk));
        pump();
    }

    void end() {
        if (!streaming_ || closed_ || ended_) return;
        ended_ = true;
        pump();
    }

    bool closed() const { return closed_.load(); }

    void on_close(std::function<void()> fn) {
        if (closed_) {
            fn();
            return;
        }
        close_fns_.push_back(std::move(fn));
        watch_peer();
    }

    // The socket was accepted on a strand, so this executor serialises all work on the session.
    beast::tcp_stream::executor_type executor() { return stream_.get_executor(); }

  private:
    void read() {
        ++req_gen_;
        parser_.emplace();
        parser_->body_limit(cfg_.max_body);
        parser_->header_limit(64 * 1024);
        replied_ = streaming_ = ended_ = false;
        stream_.expires_after(std::chrono::seconds(cfg_.idle_timeout_s));
        http::async_read(stream_, buf_, *parser_,
                         [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
    }

    void on_read(beast::error_code ec) {
        if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout) return fail();
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
        try {
            handler_(std::move(req), make_reply());
        } catch (const std::exception & e) {
            spdlog::error("handler threw: {}", e.what());
            send(500, "application/json",
                 R"({"error":{"message":"internal error","type":"server_error","param":null,"code":null}})", {});
        }
    }

    std::shared_ptr<Responder> make_reply();

    void after_response(beast::error_code ec) {
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
        stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
        stream_.expires_after(std::chrono::seconds(5));
        drain_buf_.resize(64 * 1024);
        stream_.async_read_some(net::buffer(drain_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
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
            net::async_write(stream_, http::make_chunk(net::buffer(*chunk)),
                             [self = shared_from_this(), chunk](beast::error_code ec, size_t) {
                                 self->writing_ = false;
                                 if (ec) return self->fail();
                                 self->pump();
                             });
        } else if (ended_ && !finished_) {
            finished_ = true;
            writing_ = true;
            net::async_write(stream_, http::make_chunk_last(),
                             [self = shared_from_this()](beast::error_code ec, size_t) {
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
        stream_.socket().async_wait(
            tcp::socket::wait_read, [self = shared_from_this(), gen = req_gen_](beast::error_code ec) {
                if (ec == net::error::operation_aborted || gen != self->req_gen_ || self->finished_request(gen)) return;
                beast::error_code ec2;
                const size_t avail = self->stream_.socket().available(ec2);
                if (ec || ec2 || avail == 0) self->fail();
            });
    }

    bool finished_request(uint64_t gen) const { return gen != req_gen_ || (replied_ && !streaming_) || finished_; }

    void fail() {
        if (closed_.exchange(true)) return;
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
        stream_.socket().close(ec);
        auto fns = std::move(close_fns_);
        for (auto & fn : fns)
            fn();
    }

    beast::tcp_stream stream_;
    const HttpConfig & cfg_;
    const Handler & handler_;
    std::atomic<size_t> & count_;
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
};

//! Responder bound to one request of a Session; posts every call onto the session's strand.
class Reply : public Responder {
  public:
    explicit Reply(std::shared_ptr<Session> s) : s_(std::move(s)) {}
    void send(int status, const std::string & type, std::string body, Headers extra) override {
        net::dispatch(s_->executor(), [s = s_, status, type, b = std::move(body), e = std::move(extra)]() mutable {
            s->send(unsigned(status), type, std::move(b), e);
        });
    }
    void start_stream(int status, Headers extra) override {
        net::dispatch(s_->executor(), [s = s_, status, e = std::move(extra)] { s->start_stream(unsigned(status), e); });
    }
    void write(std::string chunk) override {
        net::post(s_->executor(), [s = s_, c = std::move(chunk)]() mutable { s->write(std::move(c)); });
    }
    void end() override {
        net::post(s_->executor(), [s = s_] { s->end(); });
    }
    bool closed() const override { return s_->closed(); }
    void on_close(std::function<void()> fn) override {
        net::dispatch(s_->executor(), [s = s_, f = std::move(fn)]() mutable { s->on_close(std::move(f)); });
    }

  private:
    std::shared_ptr<Session> s_;
};

std::shared_ptr<Responder> Session::make_reply() {
    return std::make_shared<Reply>(shared_from_this());
}

}  // namespace

HttpServer::HttpServer(HttpConfig cfg, Handler handler)
    : cfg_(std::move(cfg)),
      handler_(std::move(handler)),
      acceptor_(net::make_strand(ioc_)),
      accept_retry_(acceptor_.get_executor()) {
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
            // Full: say so and close, without keeping any state for this connection. The reply
            // is small enough for a fresh socket's send buffer, so the blocking write returns.
            static const std::string full = [] {
                const std::string body =
                    R"({"error":{"message":"the server has too many open connections; retry shortly",)"
                    R"("type":"service_unavailable_error","param":null,"code":"overloaded"}})";
                return "HTTP/1.1 503 Service Unavailable\r\nServer: armada\r\nContent-Type: application/json\r\n"
                       "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body;
            }();
            net::write(sock, net::buffer(full), ec);
            sock.shutdown(tcp::socket::shutdown_both, ec);
            sock.close(ec);
            return accept();
        }
        sock.set_option(tcp::no_delay(true), ec);
        std::make_shared<Session>(std::move(sock), cfg_, handler_, connections_)->start();
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

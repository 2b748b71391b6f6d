#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace armada::api {

//! A parsed HTTP request, in native types. Header names are lower-case.
struct HttpRequest {
    std::string method;
    std::string path;
    std::string query;
    std::map<std::string, std::string> headers;
    std::string body;

    std::string header(const std::string & lower_name) const {
        auto it = headers.find(lower_name);
        return it == headers.end() ? std::string() : it->second;
    }
    //! The first `name=value` of the query string, percent-decoded; "" when absent.
    std::string param(const std::string & name) const;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

//! The reply side of one request. Every method is thread-safe: work is posted to the
//! connection's strand, so the engine thread can call `write` without blocking.
class Responder {
  public:
    virtual ~Responder() = default;
    //! Sends a whole response. Only the first send/start_stream of a request takes effect.
    virtual void send(int status, const std::string & content_type, std::string body, Headers extra = {}) = 0;
    //! Starts a chunked text/event-stream response.
    virtual void start_stream(int status, Headers extra = {}) = 0;
    //! Queues one chunk of a stream.
    virtual void write(std::string chunk) = 0;
    //! Ends the stream; the connection is then reused for the next request.
    virtual void end() = 0;
    //! True once the client has gone away.
    virtual bool closed() const = 0;
    //! `fn` runs once, on an I/O thread, if the client goes away before the response ends.
    virtual void on_close(std::function<void()> fn) = 0;
    //! This stream follows something that may last for hours (a session's events): a draining
    //! server does not wait for it to end.
    virtual void long_lived() {}
    //! Bytes of a stream handed to `write` and not yet sent to the client. A sender of a large
    //! body paces itself on it (past `HttpConfig::max_stream_backlog` the stream is closed).
    virtual size_t backlog() const { return 0; }
    //! Closes the connection without ending the response: the client sees the body break off
    //! (a sender that cannot go on after its header went out).
    virtual void abort() {}
};

using Handler = std::function<void(HttpRequest &&, std::shared_ptr<Responder>)>;

//! Limits and settings of the HTTP front end.
struct HttpConfig {
    std::string host = "127.0.0.1";
    uint16_t port = 8080;  // 0 picks a free port
    int threads = 2;
    size_t max_body = 2 * 1024 * 1024;
    int idle_timeout_s = 600;
    //! A long-lived event stream that has sent nothing for this long gets an SSE comment line, so
    //! a proxy (or the gateway) can tell a quiet stream from a hung server. 0: none.
    int heartbeat_ms = 5000;
    //! Open connections beyond which new ones get 503 and are closed. 0: the process's file
    //! descriptor limit less a reserve for the store, the journal and tools.
    size_t max_connections = 0;
    //! Bytes a stream may have queued for a client that does not read them; beyond it the client
    //! is too slow (or gone without a word) and the connection is closed. Its EventSource
    //! reconnects, with Last-Event-ID where the stream has ids.
    size_t max_stream_backlog = 16u << 20;
    //! Seconds a request's head (request line and headers) may take to arrive; on a new
    //! connection they count from the accept, so a client that connects and says nothing, or
    //! trickles its headers, is dropped before it is authenticated. 0: idle_timeout_s.
    int header_timeout_s = 0;
    //! Open connections one client address may hold; beyond it a new one gets 429 with
    //! Retry-After and is closed. 0: no cap of its own.
    size_t max_connections_per_client = 0;
    //! HTTPS (PEM files, as llama-server's --ssl-cert-file / --ssl-key-file); both or neither.
    std::string ssl_cert_file;
    std::string ssl_key_file;
};

//! Asynchronous HTTP/1.1 server on Boost.Beast: a few I/O threads, no thread per connection.
class HttpServer {
  public:
    HttpServer(HttpConfig cfg, Handler handler);
    ~HttpServer();
    //! Binds and listens. Returns an error message, empty on success.
    std::string listen();
    //! Starts the I/O threads.
    void run();
    void stop();
    uint16_t port() const { return port_; }
    size_t connections() const { return connections_.load(); }
    //! Requests read whose response has not been written to the end (long-lived streams aside).
    size_t exchanges() const { return exchanges_.load(); }
    //! Executor of the I/O threads, for work that must not run on the engine thread.
    boost::asio::any_io_executor executor() { return ioc_.get_executor(); }
    //! Answers from now on carry `Connection: close`, so keep-alive clients go elsewhere.
    void set_closing() { closing_.store(true); }
    bool tls() const { return tls_ != nullptr; }

  private:
    void accept();

    HttpConfig cfg_;
    Handler handler_;
    boost::asio::io_context ioc_;
    boost::asio::ip::tcp::acceptor acceptor_;
    std::vector<std::thread> threads_;
    uint16_t port_ = 0;
    size_t max_connections_ = 0;
    std::atomic<size_t> connections_{0};
    std::atomic<size_t> exchanges_{0};
    boost::asio::steady_timer accept_retry_;

  public:
    struct PerClient;  // open connections by client address

  private:
    std::shared_ptr<PerClient> per_client_;
    std::chrono::steady_clock::time_point last_accept_warning_{};
    std::unique_ptr<boost::asio::ssl::context> tls_;
    std::atomic<bool> closing_{false};
};

}  // namespace armada::api

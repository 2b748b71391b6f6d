#include "tools/http_tool.h"

#include "tools/charset.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>

namespace armada::tools {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

bool parse_url(const std::string & text, Url & out) {
    const auto p = text.find("://");
    if (p == std::string::npos) return false;
    out.scheme = text.substr(0, p);
    if (out.scheme != "http" && out.scheme != "https") return false;
    std::string rest = text.substr(p + 3);
    const auto slash = rest.find_first_of("/?");
    std::string hostport = rest.substr(0, slash);
    out.target = slash == std::string::npos ? "/" : rest.substr(slash);
    if (out.target[0] == '?') out.target = "/" + out.target;
    if (hostport.empty() || hostport.find('@') != std::string::npos) return false;
    if (hostport[0] == '[') {
        const auto close = hostport.find(']');
        if (close == std::string::npos) return false;
        out.host = hostport.substr(1, close - 1);
        out.port = close + 1 < hostport.size() && hostport[close + 1] == ':' ? hostport.substr(close + 2) : "";
    } else {
        const auto colon = hostport.rfind(':');
        out.host = hostport.substr(0, colon);
        out.port = colon == std::string::npos ? "" : hostport.substr(colon + 1);
    }
    if (out.port.empty()) out.port = out.scheme == "https" ? "443" : "80";
    return !out.host.empty();
}

bool resolve_secret(const std::string & value, std::string & out, std::string & error) {
    out.clear();
    size_t i = 0;
    while (i < value.size()) {
        const auto open = value.find("${", i);
        if (open == std::string::npos) {
            out += value.substr(i);
            break;
        }
        out += value.substr(i, open - i);
        const auto close = value.find('}', open);
        if (close == std::string::npos) {
            error = "unterminated ${ in a header value";
            return false;
        }
        const std::string ref = value.substr(open + 2, close - open - 2);
        if (ref.rfind("env:", 0) == 0) {
            const char * v = std::getenv(ref.substr(4).c_str());
            if (!v) {
                error = "environment variable " + ref.substr(4) + " is not set";
                return false;
            }
            out += v;
        } else if (ref.rfind("file:", 0) == 0) {
            std::ifstream f(ref.substr(5));
            if (!f) {
                error = "secret file " + ref.substr(5) + " cannot be read";
                return false;
            }
            std::stringstream ss;
            ss << f.rdbuf();
            std::string s = ss.str();
            while (!s.empty() && (s.back() == '\n' || s.back() == '\r'))
                s.pop_back();
            out += s;
        } else {
            error = "unknown reference ${" + ref.substr(0, ref.find(':')) + ":...} in a header value";
            return false;
        }
        i = close + 1;
    }
    return true;
}

namespace {

//! One tool call across its attempts and redirects. Keeps itself alive through its handlers.
class Exchange : public std::enable_shared_from_this<Exchange> {
  public:
    Exchange(net::any_io_executor io, const SsrfGuard & guard, agent::HttpToolSpec spec, ToolCall call,
             std::function<void(ToolResult)> done)
        : io_(io),
          guard_(guard),
          spec_(std::move(spec)),
          call_(std::move(call)),
          done_(std::move(done)),
          resolver_(io),
          timer_(io),
          t0_(std::chrono::steady_clock::now()) {}

    void start() {
        for (const auto & [k, v] : spec_.headers) {
            std::string resolved, err;
            if (!resolve_secret(v, resolved, err))
                return finish_error("tool '" + spec_.name + "' header " + k + ": " + err, false);
            headers_.emplace_back(k, resolved);
        }
        url_text_ = spec_.url;
        attempt();
    }

  private:
    void attempt() {
        ++attempts_;
        attempt_t0_ = std::chrono::steady_clock::now();
        redirects_ = 0;
        go(url_text_);
    }

    void go(const std::string & url) {
        if (!parse_url(url, url_)) return finish_error("tool URL is not valid: " + url, false);
        if (url_.scheme == "https") return finish_error("https tool URLs are not supported by this build yet", false);
        stream_ = std::make_unique<beast::tcp_stream>(io_);
        stream_->expires_after(std::chrono::milliseconds(spec_.timeout_ms));
        resolver_.async_resolve(url_.host, url_.port,
                                [self = shared_from_this()](beast::error_code ec, tcp::resolver::results_type r) {
                                    self->on_resolve(ec, std::move(r));
                                });
    }

    void on_resolve(beast::error_code ec, tcp::resolver::results_type results) {
        if (ec) return retry_or_fail("cannot resolve " + url_.host + ": " + ec.message());
        std::vector<tcp::endpoint> ok;
        std::string denied;
        for (const auto & e : results) {
            const std::string why = guard_.reason(e.endpoint().address());
            if (why.empty())
                ok.push_back(e.endpoint());
            else
                denied = why;
        }
        if (ok.empty()) return finish_error("tool call blocked: " + denied, false);
        stream_->async_connect(
            ok, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint &) { self->on_connect(ec); });
    }

    void on_connect(beast::error_code ec) {
        if (ec) return retry_or_fail("cannot connect to " + url_.host + ": " + ec.message());
        req_ = {};
        req_.version(11);
        req_.method(redirects_ > 0 && status_ == 303 ? http::verb::get : http::string_to_verb(spec_.method));
        req_.target(url_.target);
        req_.set(http::field::host, url_.host);
        req_.set(http::field::user_agent, "armada");
        req_.set(http::field::content_type, "application/json");
        req_.set(http::field::accept, "application/json, text/plain;q=0.9, */*;q=0.5");
        req_.set("Idempotency-Key", call_.idempotency_key);
        for (const auto & [k, v] : headers_)
            req_.set(k, v);
        if (req_.method() != http::verb::get) req_.body() = call_.arguments;
        req_.prepare_payload();
        http::async_write(*stream_, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
            if (ec) return self->retry_or_fail("cannot send the request: " + ec.message());
            self->read();
        });
    }

    void read() {
        parser_.emplace();
        // No parser limit: read_more() cuts the body at the tool's own cap. Not boost::none:
        // Boost 1.74 compares a Content-Length against an empty limit as "over", so every reply
        // that declares its length would fail with body_limit.
        parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
        buf_.clear();
        read_more();
    }

    // Reads piece by piece so a body over the cap is cut, not refused.
    void read_more() {
        http::async_read_some(*stream_, buf_, *parser_,
                              [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
    }

    void on_read(beast::error_code ec) {
        const bool over = parser_->get().body().size() > size_t(spec_.max_body);
        if (ec && ec != http::error::end_of_stream && !(over && parser_->is_header_done())) {
            if (ec == beast::error::timeout)
                return retry_or_fail("the tool did not answer within " + std::to_string(spec_.timeout_ms) + " ms");
            return retry_or_fail("error reading the reply: " + ec.message());
        }
        if (!parser_->is_done() && !over && !ec) return read_more();
        auto & res = parser_->get();
        status_ = res.result_int();
        beast::error_code ignored;
        stream_->socket().shutdown(tcp::socket::shutdown_both, ignored);
        if (status_ >= 300 && status_ < 400 && res.count(http::field::location)) {
            if (++redirects_ > 3) return finish_error("the tool redirected more than 3 times", false);
            std::string loc(res[http::field::location]);
            if (loc.rfind("http", 0) != 0) loc = url_.scheme + "://" + url_.host + ":" + url_.port + loc;
            return go(loc);  // resolved and checked again, so a redirect cannot reach a denied address
        }
        if (status_ >= 500) return retry_or_fail("the tool answered HTTP " + std::to_string(status_));
        std::string body = res.body();
        bool cut = false;
        if (body.size() > size_t(spec_.max_body)) {
            body.resize(size_t(spec_.max_body));
            cut = true;
        }
        ToolResult r;
        r.http_status = int(status_);
        r.content = to_utf8(body, charset_of(std::string(res[http::field::content_type])));
        if (cut) r.content += "\n[output truncated at " + std::to_string(spec_.max_body) + " bytes]";
        r.is_error = status_ >= 400;
        finish(std::move(r));
    }

    void retry_or_fail(const std::string & why_in) {
        // Whichever operation the deadline interrupted, say it was the deadline.
        const auto spent = std::chrono::steady_clock::now() - attempt_t0_;
        const std::string why = spent >= std::chrono::milliseconds(spec_.timeout_ms)
                                    ? "the tool did not answer within " + std::to_string(spec_.timeout_ms) + " ms"
                                    : why_in;
        if (attempts_ <= spec_.retries) {
            // Exponential backoff from 100 ms; the same idempotency key goes with every attempt.
            timer_.expires_after(std::chrono::milliseconds(100 << std::min(attempts_ - 1, 6)));
            timer_.async_wait([self = shared_from_this()](beast::error_code) { self->attempt(); });
            return;
        }
        finish_error(why + (attempts_ > 1 ? " (after " + std::to_string(attempts_) + " attempts)" : ""), true);
    }

    void finish_error(const std::string & why, bool) {
        ToolResult r;
        r.is_error = true;
        r.http_status = int(status_);
        r.content = "tool error: " + why;
        finish(std::move(r));
    }

    void finish(ToolResult r) {
        r.attempts = attempts_;
        r.latency_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
        auto done = std::move(done_);
        if (done) done(std::move(r));
    }

    net::any_io_executor io_;
    const SsrfGuard & guard_;
    agent::HttpToolSpec spec_;
    ToolCall call_;
    std::function<void(ToolResult)> done_;
    tcp::resolver resolver_;
    net::steady_timer timer_;
    std::chrono::steady_clock::time_point t0_, attempt_t0_;
    std::vector<std::pair<std::string, std::string>> headers_;
    std::string url_text_;
    Url url_;
    std::unique_ptr<beast::tcp_stream> stream_;
    http::request<http::string_body> req_;
    std::optional<http::response_parser<http::string_body>> parser_;
    beast::flat_buffer buf_;
    unsigned status_ = 0;
    int attempts_ = 0, redirects_ = 0;
};

}  // namespace

void HttpToolTransport::call(const agent::HttpToolSpec & spec, const ToolCall & call,
                             std::function<void(ToolResult)> done) {
    std::make_shared<Exchange>(io_, guard_, spec, call, std::move(done))->start();
}

}  // namespace armada::tools

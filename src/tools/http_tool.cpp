#include "tools/http_tool.h"
#include "common/backoff.h"

#include "tools/charset.h"
#include "tools/tls.h"

#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
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

namespace {
std::string lower(std::string s) {
    for (auto & c : s)
        c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string authority(const Url & u) {
    const std::string host = u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host;
    return u.scheme + "://" + host + ":" + u.port;
}
}  // namespace

bool same_origin(const Url & a, const Url & b) {
    return lower(a.scheme) == lower(b.scheme) && lower(a.host) == lower(b.host) && a.port == b.port;
}

std::string resolve_location(const Url & base, const std::string & location) {
    const std::string l = lower(location.substr(0, 8));
    if (l.rfind("http://", 0) == 0 || l.rfind("https://", 0) == 0) return location;
    if (location.rfind("//", 0) == 0) return base.scheme + ":" + location;
    if (location.rfind('/', 0) == 0) return authority(base) + location;
    // A relative path: beside the current resource.
    std::string dir = base.target.substr(0, base.target.find('?'));
    dir = dir.substr(0, dir.rfind('/') + 1);
    return authority(base) + (dir.empty() ? "/" : dir) + location;
}

std::set<std::string> names_of(const std::map<std::string, std::string> & headers) {
    std::set<std::string> out;
    for (const auto & [k, v] : headers)
        out.insert(lower(k));
    return out;
}

bool dropped_across_origins(const std::string & header, const std::set<std::string> & sensitive) {
    const std::string h = lower(header);
    return h == "authorization" || h == "cookie" || h == "proxy-authorization" || sensitive.count(h) > 0;
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
    Exchange(net::any_io_executor io, const SsrfGuard & guard, std::shared_ptr<net::ssl::context> tls,
             HttpToolSpec spec, ToolCall call, std::function<void(ToolResult)> done)
        : io_(net::make_strand(io)),
          guard_(guard),
          tls_(std::move(tls)),
          spec_(std::move(spec)),
          call_(std::move(call)),
          done_(std::move(done)),
          resolver_(io_),
          timer_(io_),
          t0_(std::chrono::steady_clock::now()) {}

    //! Starts the call on its strand.
    void begin() {
        net::dispatch(io_, [self = shared_from_this()] { self->start(); });
    }

  private:
    void start() {
        for (const auto & [k, v] : spec_.headers) {
            // Only the operator's agents name secrets; a client's headers are sent as written.
            std::string resolved = v, err;
            if (spec_.expand_secrets && !resolve_secret(v, resolved, err))
                return finish_error("tool '" + spec_.name + "' header " + k + ": " + err, false);
            headers_.emplace_back(k, resolved);
        }
        sensitive_ = names_of(spec_.headers);
        if (!parse_url(spec_.url, first_)) return finish_error("tool URL is not valid: " + spec_.url, false);
        attempt();
    }

    void attempt() {
        ++attempts_;
        attempt_t0_ = std::chrono::steady_clock::now();
        redirects_ = 0;
        status_ = 0;
        cross_origin_ = false;
        method_ = http::string_to_verb(spec_.method);
        go(spec_.url);
    }

    template <class F>
    void with_stream(F && f) {
        if (tls_stream_)
            f(*tls_stream_);
        else
            f(*stream_);
    }

    beast::tcp_stream & tcp() { return tls_stream_ ? beast::get_lowest_layer(*tls_stream_) : *stream_; }

    void go(const std::string & url) {
        if (!parse_url(url, url_)) return finish_error("tool URL is not valid: " + url, false);
        if (url_.scheme == "https" && !tls_) return finish_error("https tool URLs need TLS, which is off", false);
        stream_.reset();
        tls_stream_.reset();
        if (url_.scheme == "https") {
            tls_stream_ = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(io_, *tls_);
            expect_peer_name(tls_stream_->native_handle(), url_.host);
        } else {
            stream_ = std::make_unique<beast::tcp_stream>(io_);
        }
        tcp().expires_after(std::chrono::milliseconds(spec_.timeout_ms));
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
        tcp().async_connect(
            ok, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint &) { self->on_connect(ec); });
    }

    void on_connect(beast::error_code ec) {
        if (ec) return retry_or_fail("cannot connect to " + url_.host + ": " + ec.message());
        if (!tls_stream_) return send();
        tls_stream_->async_handshake(net::ssl::stream_base::client, [self = shared_from_this()](beast::error_code e) {
            if (e) {
                // A certificate that does not verify will not verify on the next attempt either.
                if (e.category() == net::error::get_ssl_category() ||
                    SSL_get_verify_result(self->tls_stream_->native_handle()) != X509_V_OK)
                    return self->finish_error(tls_failure(e, self->tls_stream_->native_handle(), self->url_.host),
                                              false);
                return self->retry_or_fail("TLS handshake with " + self->url_.host + " failed: " + e.message());
            }
            self->send();
        });
    }

    void send() {
        // Asked again just before the bytes go: a process stopped (SIGSTOP, starved) between the
        // first check and here wakes with its lease maybe gone, and another node may have sent
        // this call meanwhile.
        if (held_back()) return;
        req_ = {};
        req_.version(11);
        req_.method(method_);
        req_.target(url_.target);
        req_.set(http::field::host, url_.host);
        req_.set(http::field::user_agent, "armada");
        req_.set(http::field::content_type, "application/json");
        req_.set(http::field::accept, "application/json, text/plain;q=0.9, */*;q=0.5");
        req_.set("Idempotency-Key", call_.idempotency_key);
        if (!call_.traceparent.empty()) req_.set("traceparent", call_.traceparent);
        for (const auto & [k, v] : headers_) {
            // Once a redirect leaves the tool's origin, its credentials stay behind, as in browsers.
            if (cross_origin_ && dropped_across_origins(k, sensitive_)) continue;
            req_.set(k, v);
        }
        if (method_ != http::verb::get) req_.body() = call_.arguments;
        req_.prepare_payload();
        with_stream([&](auto & s) {
            http::async_write(s, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
                if (ec) return self->retry_or_fail("cannot send the request: " + ec.message());
                self->read();
            });
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
        with_stream([&](auto & s) {
            http::async_read_some(s, buf_, *parser_,
                                  [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
        });
    }

    void on_read(beast::error_code ec) {
        const bool over = parser_->get().body().size() > size_t(spec_.max_body);
        // A TLS peer that closes without close_notify (stream_truncated) has still sent its reply.
        const bool eof = ec == http::error::end_of_stream || ec == net::ssl::error::stream_truncated;
        if (ec && !eof && !(over && parser_->is_header_done())) {
            if (ec == beast::error::timeout)
                return retry_or_fail("the tool did not answer within " + std::to_string(spec_.timeout_ms) + " ms");
            return retry_or_fail("error reading the reply: " + ec.message());
        }
        if (!parser_->is_done() && !over && !ec) return read_more();
        auto & res = parser_->get();
        status_ = res.result_int();
        beast::error_code ignored;
        tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
        if (status_ >= 300 && status_ < 400 && res.count(http::field::location)) {
            const std::string next = resolve_location(url_, std::string(res[http::field::location]));
            if (!spec_.follow_redirects) {
                return finish_error("the tool answered HTTP " + std::to_string(status_) + " (a redirect to " + next +
                                        "), and its follow_redirects is false",
                                    false);
            }
            if (++redirects_ > 3) return finish_error("the tool redirected more than 3 times", false);
            Url to;
            if (!parse_url(next, to)) return finish_error("the tool redirected to an invalid URL: " + next, false);
            if (!same_origin(first_, to)) cross_origin_ = true;
            // As curl and browsers do: 301, 302 and 303 continue as a GET; 307 and 308 repeat the request.
            if (status_ == 301 || status_ == 302 || status_ == 303) method_ = http::verb::get;
            return go(next);  // resolved and checked again, so a redirect cannot reach a denied address
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
            const int backoff_ms = int(common::backoff_ms(100, attempts_ - 1, 6400));
            spdlog::info("tool call {} to {}: {}; attempt {} of {} in {} ms",
                         call_.idempotency_key.empty() ? spec_.name : call_.idempotency_key, url_.host, why,
                         attempts_ + 1, spec_.retries + 1, backoff_ms);
            timer_.expires_after(std::chrono::milliseconds(backoff_ms));
            timer_.async_wait([self = shared_from_this()](beast::error_code) { self->retry(); });
            return;
        }
        finish_error(why + (attempts_ > 1 ? " (after " + std::to_string(attempts_) + " attempts)" : ""), true);
    }

    //! The caller no longer allows sending (its node's lease is not current): finished, unsent.
    bool held_back() {
        if (!call_.may_send || call_.may_send()) return false;
        ToolResult r;
        r.not_sent = true;
        r.is_error = true;
        r.content = "tool error: not sent: this node's lease was not current";
        finish(std::move(r));
        return true;
    }

    //! The next attempt, if the caller still allows one (its node's lease is current).
    void retry() {
        if (held_back()) return;
        attempt();
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

    // The I/O threads run many handlers at once. A strand runs this call's one at a time: without
    // it, a stream's deadline (which closes the socket) could fire on one thread while a read
    // finishes on the other, and the socket was closed twice (a crash in the reactor).
    net::any_io_executor io_;
    const SsrfGuard & guard_;
    std::shared_ptr<net::ssl::context> tls_;
    HttpToolSpec spec_;
    ToolCall call_;
    std::function<void(ToolResult)> done_;
    tcp::resolver resolver_;
    net::steady_timer timer_;
    std::chrono::steady_clock::time_point t0_, attempt_t0_;
    std::vector<std::pair<std::string, std::string>> headers_;
    std::set<std::string> sensitive_;
    Url first_, url_;
    std::unique_ptr<beast::tcp_stream> stream_;
    std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls_stream_;
    http::verb method_ = http::verb::post;
    bool cross_origin_ = false;
    http::request<http::string_body> req_;
    std::optional<http::response_parser<http::string_body>> parser_;
    beast::flat_buffer buf_;
    unsigned status_ = 0;
    int attempts_ = 0, redirects_ = 0;
};

}  // namespace

void HttpToolTransport::call(const HttpToolSpec & spec, const ToolCall & call, std::function<void(ToolResult)> done) {
    std::make_shared<Exchange>(io_, guard_, tls_, spec, call, std::move(done))->begin();
}

}  // namespace armada::tools

#include "tools/http_tool.h"

#include "common/backoff.h"
#include "net/http_client.h"
#include "net/url.h"
#include "tools/charset.h"

#include <spdlog/spdlog.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

namespace armada::tools {

namespace net = boost::asio;

std::set<std::string> names_of(const std::map<std::string, std::string> & headers) {
    std::set<std::string> out;
    for (const auto & [k, v] : headers) {
        std::string name = k;
        for (auto & c : name)
            c = char(std::tolower(static_cast<unsigned char>(c)));
        out.insert(name);
    }
    return out;
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

//! One tool call across its attempts. Keeps itself alive through its handlers.
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
          timer_(io_),
          t0_(std::chrono::steady_clock::now()) {}

    //! Starts the call on its strand.
    void begin() {
        net::dispatch(io_, [self = shared_from_this()] { self->start(); });
    }

  private:
    void start() {
        armada::net::HttpRequest & r = request_;
        r.method = spec_.method;
        r.url = spec_.url;
        r.headers = {{"Content-Type", "application/json"},
                     {"Accept", "application/json, text/plain;q=0.9, */*;q=0.5"},
                     {"Idempotency-Key", call_.idempotency_key}};
        if (!call_.traceparent.empty()) r.headers.emplace_back("traceparent", call_.traceparent);
        for (const auto & [k, v] : spec_.headers) {
            // Only the operator's agents name secrets; a client's headers are sent as written.
            std::string resolved = v, err;
            if (spec_.expand_secrets && !resolve_secret(v, resolved, err))
                return finish_error("tool '" + spec_.name + "' header " + k + ": " + err);
            r.headers.emplace_back(k, resolved);
        }
        if (spec_.method != "GET") r.body = call_.arguments;
        armada::net::Url u;
        if (!armada::net::parse_url(spec_.url, u)) return finish_error("tool URL is not valid: " + spec_.url);
        host_ = u.host;  // what the log names: a URL's query may hold a key
        auto & o = options_;
        o.timeout_ms = spec_.timeout_ms;
        o.max_body = uint64_t(spec_.max_body);
        o.cut_body = true;
        o.tls = tls_.get();
        o.ca_setting = "--tool-ca-file";
        o.admit = [this](const net::ip::address & a) { return guard_.reason(a); };
        // Redirects are followed here only to say one was not: the client follows them.
        o.max_redirects = spec_.follow_redirects ? 3 : 0;
        o.sensitive = names_of(spec_.headers);
        // Asked again just before the bytes go: a process stopped (SIGSTOP, starved) between the
        // first check and then wakes with its lease maybe gone, and another node may have sent
        // this call meanwhile.
        o.may_send = call_.may_send;
        attempt();
    }

    void attempt() {
        ++attempts_;
        armada::net::http_call_async(io_, request_, options_, [self = shared_from_this()](armada::net::HttpReply r) {
            net::dispatch(self->io_, [self, r = std::move(r)]() mutable { self->on_reply(std::move(r)); });
        });
    }

    void on_reply(armada::net::HttpReply r) {
        using armada::net::HttpFailure;
        status_ = unsigned(r.status);
        switch (r.failure) {
            case HttpFailure::none:
                break;
            case HttpFailure::not_sent:
                return not_sent();
            case HttpFailure::no_tls:
                return finish_error("https tool URLs need TLS, which is off");
            case HttpFailure::bad_request:
            case HttpFailure::tls_refused:
                return finish_error(r.error);
            case HttpFailure::blocked:
                return finish_error("tool call " + r.error);
            case HttpFailure::redirects:
                return finish_error(r.error.rfind("more than", 0) == 0 ? "the tool redirected more than 3 times"
                                                                       : "the tool sent " + r.error);
            case HttpFailure::timeout:
                return retry_or_fail("the tool did not answer within " + std::to_string(spec_.timeout_ms) + " ms");
            default:
                return retry_or_fail(r.error);
        }
        if (status_ >= 300 && status_ < 400 && r.header("location") && !spec_.follow_redirects) {
            armada::net::Url at;
            armada::net::parse_url(r.url, at);
            const std::string next = armada::net::resolve_location(at, *r.header("location"));
            return finish_error("the tool answered HTTP " + std::to_string(status_) + " (a redirect to " + next +
                                "), and its follow_redirects is false");
        }
        if (status_ >= 500) return retry_or_fail("the tool answered HTTP " + std::to_string(status_));
        ToolResult res;
        res.http_status = int(status_);
        const std::string * type = r.header("content-type");
        res.content = to_utf8(r.body, charset_of(type ? *type : std::string()));
        if (r.truncated) res.content += "\n[output truncated at " + std::to_string(spec_.max_body) + " bytes]";
        res.is_error = status_ >= 400;
        finish(std::move(res));
    }

    void retry_or_fail(const std::string & why) {
        if (attempts_ <= spec_.retries) {
            // Exponential backoff from 100 ms; the same idempotency key goes with every attempt.
            const int backoff_ms = int(common::backoff_ms(100, attempts_ - 1, 6400));
            spdlog::info("tool call {} to {}: {}; attempt {} of {} in {} ms",
                         call_.idempotency_key.empty() ? spec_.name : call_.idempotency_key, host_, why, attempts_ + 1,
                         spec_.retries + 1, backoff_ms);
            timer_.expires_after(std::chrono::milliseconds(backoff_ms));
            timer_.async_wait([self = shared_from_this()](boost::system::error_code) { self->retry(); });
            return;
        }
        finish_error(why + (attempts_ > 1 ? " (after " + std::to_string(attempts_) + " attempts)" : ""));
    }

    //! The caller no longer allows sending (its node's lease is not current): finished, unsent.
    void not_sent() {
        ToolResult r;
        r.not_sent = true;
        r.is_error = true;
        r.content = "tool error: not sent: this node's lease was not current";
        finish(std::move(r));
    }

    //! The next attempt, if the caller still allows one (its node's lease is current).
    void retry() {
        if (call_.may_send && !call_.may_send()) return not_sent();
        attempt();
    }

    void finish_error(const std::string & why) {
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
    std::shared_ptr<net::ssl::context> tls_;
    HttpToolSpec spec_;
    ToolCall call_;
    std::function<void(ToolResult)> done_;
    net::steady_timer timer_;
    std::chrono::steady_clock::time_point t0_;
    armada::net::HttpRequest request_;
    armada::net::HttpOptions options_;
    std::string host_;
    unsigned status_ = 0;
    int attempts_ = 0;
};

}  // namespace

void HttpToolTransport::call(const HttpToolSpec & spec, const ToolCall & call, std::function<void(ToolResult)> done) {
    std::make_shared<Exchange>(io_, guard_, tls_, spec, call, std::move(done))->begin();
}

}  // namespace armada::tools

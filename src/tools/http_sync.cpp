#include "tools/http_sync.h"

#include "tools/http_tool.h"
#include "tools/tls.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

namespace armada::tools {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// One request and its reply, on a private io_context, within `deadline`.
HttpReply exchange(http::verb method, const Url & u, const std::vector<std::pair<std::string, std::string>> & headers,
                   const std::string & body, const HttpOptions & opt, const SsrfGuard & guard,
                   std::chrono::steady_clock::time_point deadline) {
    HttpReply out;
    if (u.scheme == "https" && !opt.tls) {
        out.error = "https needs TLS, which is off";
        return out;
    }
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    std::optional<beast::tcp_stream> plain;
    std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
    if (u.scheme == "https") {
        tls.emplace(ioc, *opt.tls);
        expect_peer_name(tls->native_handle(), u.host);
    } else {
        plain.emplace(ioc);
    }
    beast::tcp_stream & lowest = tls ? beast::get_lowest_layer(*tls) : *plain;
    http::request<http::string_body> req{method, u.target, 11};
    req.set(http::field::host, u.host);
    req.set(http::field::user_agent, "armada");
    for (const auto & [k, v] : headers)
        req.set(k, v);
    if (method != http::verb::get) req.body() = body;
    req.prepare_payload();
    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(opt.max_body);
    bool finished = false;

    auto on_read = [&](beast::error_code ec, size_t) {
        if (ec) {
            out.error = "cannot read the reply: " + ec.message();
            return;
        }
        finished = true;
    };
    auto on_written = [&](beast::error_code ec, size_t) {
        if (ec) {
            out.error = "cannot send: " + ec.message();
            return;
        }
        if (tls)
            http::async_read(*tls, buf, parser, on_read);
        else
            http::async_read(*plain, buf, parser, on_read);
    };
    resolver.async_resolve(u.host, u.port, [&](beast::error_code ec, tcp::resolver::results_type rs) {
        if (ec) {
            out.error = "cannot resolve " + u.host + ": " + ec.message();
            return;
        }
        std::vector<tcp::endpoint> ok;
        std::string denied;
        for (const auto & e : rs) {
            const std::string why = guard.reason(e.endpoint().address());
            if (why.empty())
                ok.push_back(e.endpoint());
            else
                denied = why;
        }
        if (ok.empty()) {
            out.error = "blocked: " + denied;
            return;
        }
        lowest.async_connect(ok, [&](beast::error_code ec2, const tcp::endpoint &) {
            if (ec2) {
                out.error = "cannot connect: " + ec2.message();
                return;
            }
            if (!tls) return http::async_write(*plain, req, on_written);
            tls->async_handshake(net::ssl::stream_base::client, [&](beast::error_code ec3) {
                if (ec3) {
                    out.error = tls_failure(ec3, tls->native_handle(), u.host);
                    return;
                }
                http::async_write(*tls, req, on_written);
            });
        });
    });
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    ioc.run_for(std::max(left, std::chrono::milliseconds(1)));
    if (!finished) {
        if (out.error.empty()) out.error = "no answer within " + std::to_string(opt.timeout_ms) + " ms";
        return out;
    }
    auto res = parser.release();
    out.status = int(res.result_int());
    for (const auto & f : res) {
        std::string name(f.name_string());
        for (auto & c : name)
            c = char(std::tolower(static_cast<unsigned char>(c)));
        out.headers[name] = std::string(f.value());
    }
    out.body = std::move(res.body());
    beast::error_code ignored;
    lowest.socket().shutdown(tcp::socket::shutdown_both, ignored);
    return out;
}

}  // namespace

HttpReply http_request(const std::string & method, const std::string & url,
                       const std::vector<std::pair<std::string, std::string>> & headers, const std::string & body,
                       const HttpOptions & opt, const SsrfGuard & guard) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt.timeout_ms);
    Url first;
    if (!parse_url(url, first)) {
        HttpReply out;
        out.error = "not a valid URL: " + url;
        return out;
    }
    Url u = first;
    http::verb verb = http::string_to_verb(method);
    bool cross = false;
    for (int redirects = 0;; ++redirects) {
        std::vector<std::pair<std::string, std::string>> sent;
        for (const auto & h : headers) {
            // Once a redirect leaves the first origin, credentials stay behind, as in browsers.
            if (!cross || !dropped_across_origins(h.first, opt.sensitive)) sent.push_back(h);
        }
        HttpReply r = exchange(verb, u, sent, body, opt, guard, deadline);
        auto loc = r.headers.find("location");
        if (!r.error.empty() || r.status < 300 || r.status >= 400 || loc == r.headers.end() || !opt.follow_redirects)
            return r;
        if (redirects == 3) {
            r.error = "more than 3 redirects";
            return r;
        }
        Url next;
        if (!parse_url(resolve_location(u, loc->second), next)) {
            r.error = "a redirect to an invalid URL: " + loc->second;
            return r;
        }
        if (!same_origin(first, next)) cross = true;
        if (r.status == 301 || r.status == 302 || r.status == 303) verb = http::verb::get;
        u = next;
    }
}

}  // namespace armada::tools

namespace armada::tools {

Download http_download(const std::string & url, const std::vector<std::pair<std::string, std::string>> & headers,
                       const std::string & path, const DownloadOptions & opt, const SsrfGuard & guard) {
    Download out;
    Url u;
    if (!parse_url(url, u)) {
        out.error = "not a valid URL: " + url;
        return out;
    }
    if (u.scheme == "https" && !opt.tls) {
        out.error = "https needs TLS, which is off";
        return out;
    }
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    std::optional<beast::tcp_stream> plain;
    std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
    if (u.scheme == "https") {
        tls.emplace(ioc, *opt.tls);
        expect_peer_name(tls->native_handle(), u.host);
    } else {
        plain.emplace(ioc);
    }
    beast::tcp_stream & lowest = tls ? beast::get_lowest_layer(*tls) : *plain;
    http::request<http::empty_body> req{http::verb::get, u.target, 11};
    req.set(http::field::host, u.host);
    req.set(http::field::user_agent, "armada");
    for (const auto & [k, v] : headers)
        req.set(k, v);
    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(opt.max_bytes);
    std::vector<char> chunk(1u << 20);
    int fd = -1;
    std::string refused;  // the start of a reply other than 200
    bool done = false;
    const auto connect_timeout = std::chrono::milliseconds(opt.connect_timeout_ms);
    const auto idle_timeout = std::chrono::milliseconds(opt.idle_timeout_ms);
    auto with_stream = [&](auto && fn) {
        if (tls)
            fn(*tls);
        else
            fn(*plain);
    };

    std::function<void()> read_more;
    auto on_body = [&](beast::error_code ec, size_t) {
        if (ec == http::error::need_buffer) ec = {};
        if (ec) {
            out.error = "the transfer broke off after " + std::to_string(out.bytes) + " bytes: " + ec.message();
            return;
        }
        const size_t n = chunk.size() - parser.get().body().size;
        if (fd >= 0) {
            for (size_t at = 0; at < n;) {
                const ssize_t w = ::write(fd, chunk.data() + at, n - at);
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) {
                    out.error = std::string("cannot write ") + path + ": " + std::strerror(errno);
                    return;
                }
                at += size_t(w);
            }
            out.bytes += n;
        } else if (refused.size() < 300) {
            refused.append(chunk.data(), std::min(n, 300 - refused.size()));
        }
        if (parser.is_done()) {
            done = true;
            return;
        }
        read_more();
    };
    read_more = [&] {
        parser.get().body().data = chunk.data();
        parser.get().body().size = chunk.size();
        lowest.expires_after(idle_timeout);
        with_stream([&](auto & s) { http::async_read(s, buf, parser, on_body); });
    };
    auto on_header = [&](beast::error_code ec, size_t) {
        if (ec) {
            out.error = "no reply: " + ec.message();
            return;
        }
        out.status = int(parser.get().result_int());
        for (const auto & f : parser.get()) {
            std::string name(f.name_string());
            for (auto & c : name)
                c = char(std::tolower(static_cast<unsigned char>(c)));
            out.headers[name] = std::string(f.value());
        }
        if (out.status == 200) {
            if (opt.check) {
                if (auto e = opt.check(out.status, out.headers); !e.empty()) {
                    out.error = e;
                    return;
                }
            }
            fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd < 0) {
                out.error = std::string("cannot create ") + path + ": " + std::strerror(errno);
                return;
            }
        }
        if (parser.is_done()) {
            done = true;
            return;
        }
        read_more();
    };
    auto on_written = [&](beast::error_code ec, size_t) {
        if (ec) {
            out.error = "cannot send: " + ec.message();
            return;
        }
        lowest.expires_after(connect_timeout);
        with_stream([&](auto & s) { http::async_read_header(s, buf, parser, on_header); });
    };
    resolver.async_resolve(u.host, u.port, [&](beast::error_code ec, tcp::resolver::results_type rs) {
        if (ec) {
            out.error = "cannot resolve " + u.host + ": " + ec.message();
            return;
        }
        std::vector<tcp::endpoint> ok;
        std::string denied;
        for (const auto & e : rs) {
            const std::string why = guard.reason(e.endpoint().address());
            if (why.empty())
                ok.push_back(e.endpoint());
            else
                denied = why;
        }
        if (ok.empty()) {
            out.error = "blocked: " + denied;
            return;
        }
        lowest.expires_after(connect_timeout);
        lowest.async_connect(ok, [&](beast::error_code ec2, const tcp::endpoint &) {
            if (ec2) {
                out.error = "cannot connect: " + ec2.message();
                return;
            }
            if (!tls) return http::async_write(*plain, req, on_written);
            tls->async_handshake(net::ssl::stream_base::client, [&](beast::error_code ec3) {
                if (ec3) {
                    out.error = tls_failure(ec3, tls->native_handle(), u.host);
                    return;
                }
                http::async_write(*tls, req, on_written);
            });
        });
    });
    ioc.run();
    if (fd >= 0) ::close(fd);
    if (done && out.status != 200)
        out.error = "HTTP " + std::to_string(out.status) + (refused.empty() ? std::string() : ": " + refused);
    else if (!done && out.error.empty())
        out.error = "the transfer ended early";
    beast::error_code ignored;
    lowest.socket().shutdown(tcp::socket::shutdown_both, ignored);
    return out;
}

}  // namespace armada::tools

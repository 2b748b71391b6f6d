#include "tools/http_sync.h"

#include "tools/http_tool.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <optional>

namespace armada::tools {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

HttpReply http_request(const std::string & method, const std::string & url,
                       const std::vector<std::pair<std::string, std::string>> & headers, const std::string & body,
                       int timeout_ms, size_t max_body, const SsrfGuard & guard) {
    HttpReply out;
    Url u;
    if (!parse_url(url, u)) {
        out.error = "not a valid URL: " + url;
        return out;
    }
    if (u.scheme != "http") {
        out.error = "only http:// is supported by this build";
        return out;
    }
    // A private io_context keeps the timeout simple: run it for at most timeout_ms.
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    http::request<http::string_body> req{http::string_to_verb(method), u.target, 11};
    req.set(http::field::host, u.host);
    req.set(http::field::user_agent, "armada");
    for (const auto & [k, v] : headers)
        req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    beast::flat_buffer buf;
    std::optional<http::response_parser<http::string_body>> parser;
    parser.emplace();
    parser->body_limit(max_body);
    bool finished = false;

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
        stream.async_connect(ok, [&](beast::error_code ec2, const tcp::endpoint &) {
            if (ec2) {
                out.error = "cannot connect: " + ec2.message();
                return;
            }
            http::async_write(stream, req, [&](beast::error_code ec3, size_t) {
                if (ec3) {
                    out.error = "cannot send: " + ec3.message();
                    return;
                }
                http::async_read(stream, buf, *parser, [&](beast::error_code ec4, size_t) {
                    if (ec4) {
                        out.error = "cannot read the reply: " + ec4.message();
                        return;
                    }
                    finished = true;
                });
            });
        });
    });
    ioc.run_for(std::chrono::milliseconds(timeout_ms));
    if (!finished) {
        if (out.error.empty()) out.error = "no answer within " + std::to_string(timeout_ms) + " ms";
        return out;
    }
    auto res = parser->release();
    out.status = int(res.result_int());
    for (const auto & f : res) {
        std::string name(f.name_string());
        for (auto & c : name)
            c = char(std::tolower(static_cast<unsigned char>(c)));
        out.headers[name] = std::string(f.value());
    }
    out.body = std::move(res.body());
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    return out;
}

}  // namespace armada::tools

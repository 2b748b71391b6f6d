#include "bench/http_client.h"

#include "tools/http_tool.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>

namespace armada::bench {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

HttpResult http_call(const std::string & method, const std::string & url, const std::string & body,
                     const std::vector<std::pair<std::string, std::string>> & headers, int timeout_ms,
                     const std::function<bool(std::string_view)> & on_chunk) {
    HttpResult out;
    tools::Url u;
    if (!tools::parse_url(url, u) || u.scheme != "http") {
        out.error = "not an http:// URL: " + url;
        return out;
    }
    try {
        net::io_context ioc;
        tcp::resolver resolver(ioc);
        beast::tcp_stream stream(ioc);
        stream.expires_after(std::chrono::milliseconds(timeout_ms));
        stream.connect(resolver.resolve(u.host, u.port));
        http::request<http::string_body> req{http::string_to_verb(method), u.target, 11};
        req.set(http::field::host, u.host);
        req.set(http::field::user_agent, "armada-bench");
        req.set(http::field::connection, "close");
        for (const auto & [k, v] : headers)
            req.set(k, v);
        if (!body.empty() || method == "POST") {
            req.body() = body;
            req.prepare_payload();
        }
        http::write(stream, req);
        beast::flat_buffer buf;
        http::response_parser<http::buffer_body> p;
        p.body_limit(std::uint64_t(1) << 40);  // boost::none compares wrongly with Content-Length in 1.74
        http::read_header(stream, buf, p);
        out.status = int(p.get().result_int());
        if (auto it = p.get().find("Retry-After"); it != p.get().end()) out.retry_after = std::string(it->value());
        char tmp[16384];
        bool reading = true;
        while (!p.is_done() && reading) {
            p.get().body().data = tmp;
            p.get().body().size = sizeof tmp;
            beast::error_code ec;
            http::read_some(stream, buf, p, ec);  // returns as soon as some body arrived (SSE)
            if (ec == http::error::need_buffer) ec = {};
            if (ec) throw beast::system_error(ec);
            const size_t n = sizeof tmp - p.get().body().size;
            if (n == 0) continue;
            if (on_chunk) {
                reading = on_chunk(std::string_view(tmp, n));
            } else {
                out.body.append(tmp, n);
            }
        }
        beast::error_code ec;
        stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    } catch (const std::exception & e) {
        out.error = e.what();
    }
    return out;
}

}  // namespace armada::bench

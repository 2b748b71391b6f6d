#include "gateway/upstream.h"

#include "tools/http_tool.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>

namespace armada::gateway {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

UpstreamReply forward(const std::string & base, const std::string & method, const std::string & target,
                      const HeaderList & headers, const std::string & body, int timeout_ms,
                      const std::function<bool(const UpstreamReply &)> & on_head,
                      const std::function<bool(std::string_view)> & on_chunk) {
    UpstreamReply out;
    tools::Url u;
    if (!tools::parse_url(base, u) || u.scheme != "http") {
        out.error = "not an http:// URL: " + base;
        return out;
    }
    try {
        net::io_context ioc;
        tcp::resolver resolver(ioc);
        beast::tcp_stream stream(ioc);
        stream.expires_after(std::chrono::milliseconds(timeout_ms));
        stream.connect(resolver.resolve(u.host, u.port));
        http::request<http::string_body> req{http::string_to_verb(method), target, 11};
        req.set(http::field::host, u.host + ":" + u.port);
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
        p.body_limit(std::uint64_t(1) << 40);
        http::read_header(stream, buf, p);
        out.status = int(p.get().result_int());
        for (const auto & f : p.get()) {
            const std::string name(f.name_string());
            std::string lower = name;
            for (auto & c : lower)
                c = char(std::tolower(static_cast<unsigned char>(c)));
            if (lower == "content-type" || lower == "retry-after" || lower == "x-request-id" ||
                lower.rfind("x-ratelimit", 0) == 0 || lower == "www-authenticate")
                out.headers.emplace_back(name, std::string(f.value()));
        }
        const bool stream_body = on_head && on_chunk && on_head(out);
        out.streamed = stream_body;
        char tmp[16384];
        bool reading = true;
        // A stream (SSE) may be quiet for long: only the connect and the head have a deadline.
        if (stream_body) stream.expires_never();
        while (!p.is_done() && reading) {
            p.get().body().data = tmp;
            p.get().body().size = sizeof tmp;
            beast::error_code ec;
            http::read_some(stream, buf, p, ec);
            if (ec == http::error::need_buffer) ec = {};
            if (ec) throw beast::system_error(ec);
            const size_t n = sizeof tmp - p.get().body().size;
            if (n == 0) continue;
            if (stream_body)
                reading = on_chunk(std::string_view(tmp, n));
            else
                out.body.append(tmp, n);
        }
        beast::error_code ec;
        stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    } catch (const std::exception & e) {
        out.error = e.what();
    }
    return out;
}

}  // namespace armada::gateway

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

bool SseParser::feed(std::string_view bytes) {
    buf_.append(bytes);
    size_t start = 0;
    for (;;) {
        const size_t nl = buf_.find('\n', start);
        if (nl == std::string::npos) break;
        std::string line = buf_.substr(start, nl - start);
        start = nl + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) {
            // As the SSE spec says: an event is dispatched when it had a data field (even an
            // empty one); each data line adds its value and a LF, and the last LF goes.
            if (has_data_) {
                data_.pop_back();
                const bool go = fn_(event_.empty() ? "message" : event_, data_);
                if (!go) {
                    event_.clear();
                    data_.clear();
                    has_data_ = false;
                    buf_.erase(0, start);
                    return false;
                }
            }
            event_.clear();
            data_.clear();
            has_data_ = false;
            continue;
        }
        if (line.rfind("event:", 0) == 0) {
            event_ = line.substr(line.size() > 6 && line[6] == ' ' ? 7 : 6);
        } else if (line.rfind("data:", 0) == 0) {
            data_ += line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
            data_ += '\n';
            has_data_ = true;
        }
    }
    buf_.erase(0, start);
    return true;
}

}  // namespace armada::bench

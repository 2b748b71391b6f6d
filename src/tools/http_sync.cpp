#include "tools/http_sync.h"

#include "net/http_client.h"

#include <cctype>

namespace armada::tools {

namespace {

std::map<std::string, std::string> lower_case(const net::HeaderList & headers) {
    std::map<std::string, std::string> out;
    for (const auto & [k, v] : headers) {
        std::string name = k;
        for (auto & c : name)
            c = char(std::tolower(static_cast<unsigned char>(c)));
        out[name] = v;
    }
    return out;
}

//! The guard as the client asks it: why an address may not be reached.
std::function<std::string(const boost::asio::ip::address &)> admit(const SsrfGuard & guard) {
    return [guard](const boost::asio::ip::address & a) { return guard.reason(a); };
}

}  // namespace

HttpReply http_request(const std::string & method, const std::string & url,
                       const std::vector<std::pair<std::string, std::string>> & headers, const std::string & body,
                       const HttpOptions & opt, const SsrfGuard & guard) {
    net::HttpOptions o;
    o.timeout_ms = opt.timeout_ms;
    o.max_body = opt.max_body;
    o.max_redirects = opt.follow_redirects ? 3 : 0;
    o.sensitive = opt.sensitive;
    o.tls = opt.tls;
    o.ca_setting = "--tool-ca-file";
    o.admit = admit(guard);
    const auto r = net::http_call({method, url, headers, body}, o);
    HttpReply out;
    out.status = r.status;
    out.headers = lower_case(r.headers);
    out.body = r.body;
    out.error = r.error;
    return out;
}

Download http_download(const std::string & url, const std::vector<std::pair<std::string, std::string>> & headers,
                       const std::string & path, const DownloadOptions & opt, const SsrfGuard & guard) {
    net::DownloadOptions o;
    o.connect_timeout_ms = opt.connect_timeout_ms;
    o.idle_timeout_ms = opt.idle_timeout_ms;
    o.max_bytes = opt.max_bytes;
    o.tls = opt.tls;
    o.admit = admit(guard);
    if (opt.check) {
        o.check = [&opt](int status, const net::HeaderList & h) { return opt.check(status, lower_case(h)); };
    }
    const auto d = net::http_download(url, headers, path, o);
    Download out;
    out.status = d.status;
    out.headers = lower_case(d.headers);
    out.bytes = d.bytes;
    out.error = d.error;
    return out;
}

}  // namespace armada::tools

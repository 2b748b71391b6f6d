#include "net/url.h"

#include <cctype>

namespace armada::net {

namespace {

std::string lower(std::string s) {
    for (auto & c : s)
        c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string bracketed(const std::string & host) {
    return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

std::string authority(const Url & u) {
    return u.scheme + "://" + bracketed(u.host) + ":" + u.port;
}

}  // namespace

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

std::string host_header(const Url & u) {
    const bool default_port = (u.scheme == "http" && u.port == "80") || (u.scheme == "https" && u.port == "443");
    return default_port ? bracketed(u.host) : bracketed(u.host) + ":" + u.port;
}

}  // namespace armada::net

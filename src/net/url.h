#pragma once

// URLs as the outgoing HTTP client (net/http_client.h) reads them, and the rules for following
// a redirect: where a Location points, and whether it stays on the first origin.

#include <string>

namespace armada::net {

//! A URL split for an HTTP request: `target` is the path and query as written on the request
//! line; `port` is filled in from the scheme when the URL names none.
struct Url {
    std::string scheme, host, port, target;
};

//! Parses http(s)://host[:port]/path?query (an IPv6 host in brackets); false when it cannot, or
//! when the URL carries user information (`user@host`).
bool parse_url(const std::string & text, Url & out);

//! Same scheme, host and port: a redirect may keep its credentials only then.
bool same_origin(const Url & a, const Url & b);
//! The absolute URL a Location header names, relative to `base`.
std::string resolve_location(const Url & base, const std::string & location);
//! The Host header for `u`: the host (in brackets for IPv6), with the port unless it is the
//! scheme's default.
std::string host_header(const Url & u);

}  // namespace armada::net

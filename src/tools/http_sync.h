#pragma once

#include "tools/ssrf.h"

#include <boost/asio/ssl/context.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace armada::tools {

//! A reply of `http_request`. `error` is set when no HTTP answer arrived.
struct HttpReply {
    int status = 0;
    std::map<std::string, std::string> headers;  // lower-case names
    std::string body;
    std::string error;
};

//! How `http_request` behaves.
struct HttpOptions {
    int timeout_ms = 10000;  // the whole exchange, redirects included
    size_t max_body = 8 << 20;
    //! Redirects (at most 3) within the same origin keep every header; to another origin they
    //! drop Authorization, Cookie and the headers named in `sensitive`. false: a redirect is
    //! returned as it is.
    bool follow_redirects = true;
    std::set<std::string> sensitive;  // lower-case header names
    //! For https:// (verification on); null: https is refused.
    boost::asio::ssl::context * tls = nullptr;
};

//! One HTTP/1.1 exchange that blocks the calling thread (not an I/O thread) for at most
//! `timeout_ms`. Every resolved address is checked by `guard` first, after each redirect too.
//! Body reads stop at `max_body` bytes. For worker threads of the MCP client.
HttpReply http_request(const std::string & method, const std::string & url,
                       const std::vector<std::pair<std::string, std::string>> & headers, const std::string & body,
                       const HttpOptions & opt, const SsrfGuard & guard);

}  // namespace armada::tools

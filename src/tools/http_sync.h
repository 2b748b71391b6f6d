#pragma once

#include "tools/ssrf.h"

#include <boost/asio/ssl/context.hpp>

#include <cstdint>
#include <functional>
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

//! One HTTP/1.1 exchange (net/http_client.h) that blocks the calling thread (not an I/O thread)
//! for at most `timeout_ms`. Every resolved address is checked by `guard` first, after each
//! redirect too. A body over `max_body` bytes is an error. For worker threads of the MCP client
//! and for the operator's commands.
HttpReply http_request(const std::string & method, const std::string & url,
                       const std::vector<std::pair<std::string, std::string>> & headers, const std::string & body,
                       const HttpOptions & opt, const SsrfGuard & guard);

//! How `http_download` behaves.
struct DownloadOptions {
    int connect_timeout_ms = 5000;  // resolving, connecting, TLS and the reply's header
    int idle_timeout_ms = 10000;    // the longest wait for the next piece of the body
    uint64_t max_bytes = 64ull << 30;
    boost::asio::ssl::context * tls = nullptr;  // for https:// (verification on)
    //! Called with the reply's status and headers (lower-case names) before any of the body is
    //! kept; a non-empty answer stops the download with that error.
    std::function<std::string(int status, const std::map<std::string, std::string> & headers)> check;
};

//! The result of `http_download`: `error` is empty only when the whole body of a 200 reply is in
//! the file.
struct Download {
    int status = 0;
    std::map<std::string, std::string> headers;
    uint64_t bytes = 0;  // of the body written to the file
    std::string error;
};

//! net::http_download with every address checked by `guard`: GET `url` into the file `path`,
//! streamed. No redirect is followed; a reply other than 200 is an error.
Download http_download(const std::string & url, const std::vector<std::pair<std::string, std::string>> & headers,
                       const std::string & path, const DownloadOptions & opt, const SsrfGuard & guard);

}  // namespace armada::tools

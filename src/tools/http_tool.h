#pragma once

#include "tools/ssrf.h"
#include "tools/tool_transport.h"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ssl/context.hpp>

#include <map>
#include <memory>
#include <set>

namespace armada::tools {

//! A URL split for an HTTP request.
struct Url {
    std::string scheme, host, port, target;
};

//! Parses http(s)://host[:port]/path?query; returns false when it cannot.
bool parse_url(const std::string & text, Url & out);

//! Same scheme, host and port: a redirect may keep its credentials only then.
bool same_origin(const Url & a, const Url & b);
//! The absolute URL a Location header names, relative to `base`.
std::string resolve_location(const Url & base, const std::string & location);
//! Lower-case names of `headers`.
std::set<std::string> names_of(const std::map<std::string, std::string> & headers);
//! What a request to another origin must not carry: Authorization, Cookie, and `sensitive`.
bool dropped_across_origins(const std::string & header, const std::set<std::string> & sensitive);

//! Resolves `${env:NAME}` and `${file:/path}` in a header value. Returns false (and leaves a
//! message without the secret in `error`) when the variable or file is missing.
bool resolve_secret(const std::string & value, std::string & out, std::string & error);

//! HTTP tool calls on Boost.Beast: resolve, check every address with the SSRF guard (also after
//! each redirect), POST the arguments with an Idempotency-Key, read at most the tool's body cap,
//! convert the charset to UTF-8. Retries network errors, timeouts and 5xx replies with backoff.
//! https:// is verified against `tls` (the system CA store and --tool-ca-file).
class HttpToolTransport : public ToolTransport {
  public:
    HttpToolTransport(boost::asio::any_io_executor io, SsrfGuard guard,
                      std::shared_ptr<boost::asio::ssl::context> tls = nullptr)
        : io_(std::move(io)), guard_(std::move(guard)), tls_(std::move(tls)) {}
    void call(const HttpToolSpec & spec, const ToolCall & call, std::function<void(ToolResult)> done) override;

  private:
    boost::asio::any_io_executor io_;
    SsrfGuard guard_;
    std::shared_ptr<boost::asio::ssl::context> tls_;
};

}  // namespace armada::tools

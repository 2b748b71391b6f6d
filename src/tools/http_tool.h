#pragma once

#include "tools/ssrf.h"
#include "tools/tool_transport.h"

#include <boost/asio/any_io_executor.hpp>

namespace armada::tools {

//! A URL split for an HTTP request.
struct Url {
    std::string scheme, host, port, target;
};

//! Parses http(s)://host[:port]/path?query; returns false when it cannot.
bool parse_url(const std::string & text, Url & out);

//! Resolves `${env:NAME}` and `${file:/path}` in a header value. Returns false (and leaves a
//! message without the secret in `error`) when the variable or file is missing.
bool resolve_secret(const std::string & value, std::string & out, std::string & error);

//! HTTP tool calls on Boost.Beast: resolve, check every address with the SSRF guard (also after
//! each redirect), POST the arguments with an Idempotency-Key, read at most the tool's body cap,
//! convert the charset to UTF-8. Retries network errors, timeouts and 5xx replies with backoff.
class HttpToolTransport : public ToolTransport {
  public:
    HttpToolTransport(boost::asio::any_io_executor io, SsrfGuard guard)
        : io_(std::move(io)), guard_(std::move(guard)) {}
    void call(const agent::HttpToolSpec & spec, const ToolCall & call, std::function<void(ToolResult)> done) override;

  private:
    boost::asio::any_io_executor io_;
    SsrfGuard guard_;
};

}  // namespace armada::tools

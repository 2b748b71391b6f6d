#pragma once

#include "tools/ssrf.h"
#include "tools/tool_transport.h"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ssl/context.hpp>

#include <map>
#include <memory>
#include <set>

namespace armada::tools {

//! Lower-case names of `headers`: a tool's own headers, which a redirect to another origin drops.
std::set<std::string> names_of(const std::map<std::string, std::string> & headers);

//! Resolves `${env:NAME}` and `${file:/path}` in a header value. Returns false (and leaves a
//! message without the secret in `error`) when the variable or file is missing.
bool resolve_secret(const std::string & value, std::string & out, std::string & error);

//! HTTP tool calls over net/http_client.h: every address checked with the SSRF guard (also after
//! each redirect), the arguments POSTed with an Idempotency-Key, at most the tool's body cap read,
//! the charset converted to UTF-8. Retries network errors, timeouts and 5xx replies with backoff.
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

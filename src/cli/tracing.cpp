#include "cli/tracing.h"

#include "obs/trace.h"
#include "tools/http_sync.h"
#include "tools/ssrf.h"
#include "tools/tls.h"

#include <unistd.h>

#include <memory>

namespace armada::cli {

std::string start_tracing(const std::string & endpoint, const std::string & service) {
    if (endpoint.empty()) return {};
    const bool https = endpoint.rfind("https://", 0) == 0;
    if (!https && endpoint.rfind("http://", 0) != 0)
        return "--otlp-endpoint must be an http:// or https:// URL (OTLP/HTTP), not '" + endpoint + "'";
    std::string url = endpoint;
    const size_t host_at = url.find("://") + 3;
    const size_t path_at = url.find('/', host_at);
    if (path_at == std::string::npos || path_at + 1 == url.size()) {
        // A base URL, as OTEL_EXPORTER_OTLP_ENDPOINT gives it: the signal's path is added.
        if (path_at != std::string::npos) url.pop_back();
        url += "/v1/traces";
    }
    std::shared_ptr<boost::asio::ssl::context> tls;
    if (https) {
        std::string err;
        tls = tools::client_tls("", err);
        if (!tls) return "--otlp-endpoint: " + err;
    }
    // The operator names the collector: any address it resolves to is allowed.
    auto guard = std::make_shared<tools::SsrfGuard>();
    for (const char * all : {"0.0.0.0/0", "::/0"}) {
        tools::Cidr c;
        if (tools::parse_cidr(all, c)) guard->allow(c);
    }
    auto post = [url, guard, tls](const std::string & body) -> std::string {
        tools::HttpOptions o;
        o.timeout_ms = 5000;
        o.max_body = 1 << 16;
        o.follow_redirects = false;
        o.tls = tls.get();
        const auto r = tools::http_request("POST", url, {{"Content-Type", "application/json"}}, body, o, *guard);
        if (!r.error.empty()) return r.error;
        if (r.status < 200 || r.status >= 300) return "the collector answered HTTP " + std::to_string(r.status);
        return {};
    };
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    obs::Tracer::Options o;
    o.service_name = service;
    o.resource = {{"service.instance.id", std::string(host) + "-" + std::to_string(getpid())}};
    obs::set_tracer(std::make_shared<obs::Tracer>(o, post));
    return {};
}

}  // namespace armada::cli

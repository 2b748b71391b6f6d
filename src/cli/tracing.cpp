#include "cli/tracing.h"

#include "net/tls.h"
#include "obs/trace.h"
#include "tools/http_sync.h"
#include "tools/ssrf.h"

#include <unistd.h>

#include <memory>

namespace armada::cli {

std::string otlp_traces_url(const std::string & flag, const char * traces_env, const char * base_env) {
    auto trimmed = [](std::string u) {
        while (!u.empty() && u.back() == '/')
            u.pop_back();
        return u;
    };
    if (!flag.empty()) {
        const size_t scheme = flag.find("://");
        const size_t slash = scheme == std::string::npos ? std::string::npos : flag.find('/', scheme + 3);
        const bool has_path = slash != std::string::npos && flag.find_first_not_of('/', slash) != std::string::npos;
        return has_path ? flag : trimmed(flag) + "/v1/traces";
    }
    if (traces_env && *traces_env) return traces_env;
    if (base_env && *base_env) return trimmed(base_env) + "/v1/traces";
    return {};
}

std::string start_tracing(const std::string & url, const std::string & service) {
    if (url.empty()) return {};
    const bool https = url.rfind("https://", 0) == 0;
    if (!https && url.rfind("http://", 0) != 0)
        return "the OTLP endpoint must be an http:// or https:// URL (OTLP/HTTP), not '" + url + "'";
    std::shared_ptr<boost::asio::ssl::context> tls;
    if (https) {
        std::string err;
        tls = armada::net::client_tls("", err);
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
        o.timeout_ms = 2000;  // a shutdown waits for at most one post in flight
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

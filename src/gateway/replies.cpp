#include "gateway/replies.h"

#include "api/errors.h"

namespace armada::gateway {

void send_error(const std::shared_ptr<api::Responder> & out, int status, const std::string & msg, int retry_after,
                const std::string & code) {
    api::Headers h;
    if (retry_after > 0) h.emplace_back("Retry-After", std::to_string(retry_after));
    out->send(status, "application/json", api::error_body(status, msg, {}, code), std::move(h));
}

void store_down(const std::shared_ptr<api::Responder> & out) {
    send_error(out, 503, "the cluster's state store cannot be reached; retry shortly", 2, "store_unavailable");
}

void refuse(const std::shared_ptr<api::Responder> & out, const api::Caller & caller, const cluster::QuotaRefusal & r,
            GatewayCounters & counts) {
    counts.quota_refused(r.quota);
    const std::string who =
        caller.tenant_name.empty() ? std::string("this key") : "tenant '" + caller.tenant_name + "'";
    api::Headers h{{"Retry-After", std::to_string(r.retry_after_s)}};
    out->send(429, "application/json",
              api::error_body(429,
                              who + " is over its " + r.quota + " quota (" + std::to_string(r.limit) +
                                  "); retry after " + std::to_string(r.retry_after_s) + " s",
                              r.quota, "quota_exceeded"),
              std::move(h));
}

const std::vector<std::string> & ended_states() {
    static const std::vector<std::string> kEnded = {"completed", "failed", "cancelled"};
    return kEnded;
}

}  // namespace armada::gateway

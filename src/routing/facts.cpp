#include "routing/facts.h"

#include "common/json_fields.h"

#include <nlohmann/json.hpp>

namespace armada::routing {

void read_body(const nlohmann::json & body, Asked & a) {
    if (!body.is_object()) return;
    if (auto m = common::string_field(body, "model")) a.model = *m;
    for (const char * k : {"max_completion_tokens", "max_tokens"}) {
        if (auto n = common::int_field(body, k)) {
            a.max_tokens = *n;
            break;
        }
    }
}

std::optional<RouteFacts> route_facts(const RoutingConfig & cfg, const Asked & a, std::string & error) {
    auto latency = cfg.latency_for(a.tenant, a.latency, a.admin, error);
    if (!latency) return std::nullopt;
    RouteFacts f;
    f.prompt_tokens = a.prompt_tokens;
    f.max_tokens = a.max_tokens;
    f.latency = std::move(*latency);
    f.model = a.model;
    f.long_step = a.long_step;
    f.tenant = a.tenant;
    return f;
}

}  // namespace armada::routing

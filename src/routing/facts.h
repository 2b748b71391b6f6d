#pragma once

// The one place that gathers what the routing rules look at. The gateway fills `Asked` from a
// client's request (its body, X-Armada-Latency, its key's tenant); a node's pool runner fills it
// from an agent step. A rule that needs a new fact gets it here, in `Asked`, `read_body` and
// `route_facts`, and in RouteFacts and choose_route (routing/rules.h).

#include "routing/rules.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace armada::routing {

//! What a request says of itself, before the cluster's configuration settles the rest.
struct Asked {
    std::string tenant;          // the tenant's name as the operator writes it ("" for none)
    std::string model;           // the model it names ("": none)
    int64_t prompt_tokens = -1;  // -1: not counted
    int64_t max_tokens = -1;     // -1: not given
    bool long_step = false;      // an agent step its agent marks as long (`long_after_tools`)
    std::string latency;         // the class it asks for (X-Armada-Latency; "": its tenant's own)
    bool admin = false;          // an admin key may ask for any class
};

//! `model` and the token limit (`max_completion_tokens`, else `max_tokens`) of an OpenAI
//! request body; fields of the wrong type are left unknown.
void read_body(const nlohmann::json & body, Asked & a);

//! The facts the rules see: the request's own, with its latency class settled by `cfg`. nullopt
//! with `error` when it asks for a class that does not exist or that its tenant may not use.
std::optional<RouteFacts> route_facts(const RoutingConfig & cfg, const Asked & a, std::string & error);

}  // namespace armada::routing

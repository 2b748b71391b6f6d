#pragma once

// The choice of a target for a request once its facts are known (routing/facts.h): the rules'
// first match (choose_route, routing/rules.h), then the contexts. A client's generation that fits
// neither its target nor the CPU nodes goes to a pool that holds it; an agent step goes to its
// pool only when the pool holds it, or to any pool that does when this node cannot. Pure
// functions: the gateway and a node's pool runner carry the plan out.

#include "routing/rules.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace armada::routing {

//! How many tokens one sequence of each target holds (<= 0: not known).
struct TargetContexts {
    int64_t cpu = 0;
    std::vector<std::pair<std::string, int64_t>> pools;  // in the pool set's order
    int64_t of(const std::string & target) const;
};

//! Whether a prompt of `prompt_tokens` (-1: not counted) fits a sequence of `ctx` tokens (<= 0:
//! not known, so it is taken to fit).
bool prompt_fits(int64_t prompt_tokens, int64_t ctx);

//! The largest prompt count any decision tells apart: a rule's threshold, or a target's context
//! less one. Counting may stop there.
int64_t tokens_that_matter(const std::vector<RouteRule> & rules, const TargetContexts & c);

struct GenerationPlan {
    std::string target;  // "cpu" or a pool
    std::string rule;    // the rule that chose it; "context" when the prompt chose it by size
};

//! Where a generation goes first: the first rule that matches `f` (a body that is not a JSON
//! object goes to `cpu` by `default`, and a node answers it); when the prompt fits neither that
//! target nor the CPU nodes, the first pool that holds it. The prompt may still fit nowhere: the
//! caller checks `prompt_fits` on the target it takes.
GenerationPlan plan_generation(const std::vector<RouteRule> & rules, const RouteFacts & f, bool body_is_object,
                               const TargetContexts & c);

//! Where an agent step goes: a pool, or "" for the node it is on. The rules' pool when it is in
//! `c` and holds `need` tokens (its prompt and output); else, when the node cannot hold the prompt
//! (`node_context` tokens a sequence, 0: not known), the first pool that holds the step.
std::string plan_step(const std::vector<RouteRule> & rules, const RouteFacts & f, const TargetContexts & c,
                      int64_t need, int64_t node_context);

}  // namespace armada::routing

#include "routing/choice.h"

#include <algorithm>
#include <limits>

namespace armada::routing {

int64_t TargetContexts::of(const std::string & target) const {
    if (target == "cpu") return cpu;
    for (const auto & [name, ctx] : pools) {
        if (name == target) return ctx;
    }
    return 0;
}

bool prompt_fits(int64_t prompt_tokens, int64_t ctx) {
    return prompt_tokens < 0 || ctx <= 0 || prompt_tokens < ctx;
}

int64_t tokens_that_matter(const std::vector<RouteRule> & rules, const TargetContexts & c) {
    int64_t enough = std::numeric_limits<int64_t>::max();
    for (const auto & r : rules) {
        if (r.prompt_tokens_over) enough = std::min(enough, *r.prompt_tokens_over);
    }
    if (c.cpu > 0) enough = std::min(enough, c.cpu - 1);
    for (const auto & [name, ctx] : c.pools) {
        if (ctx > 0) enough = std::min(enough, ctx - 1);
    }
    return enough;
}

GenerationPlan plan_generation(const std::vector<RouteRule> & rules, const RouteFacts & f, bool body_is_object,
                               const TargetContexts & c) {
    // Anything malformed goes to a node, which answers it with its own 400.
    const auto choice = body_is_object ? choose_route(rules, f) : RouteChoice{"cpu", "default"};
    GenerationPlan p{choice.target, choice.rule};
    // A prompt too long for the chosen target and for the CPU goes to any pool that holds it.
    if (!prompt_fits(f.prompt_tokens, c.of(p.target)) && !prompt_fits(f.prompt_tokens, c.cpu)) {
        for (const auto & [name, ctx] : c.pools) {
            if (prompt_fits(f.prompt_tokens, ctx)) return {name, "context"};
        }
    }
    return p;
}

std::string plan_step(const std::vector<RouteRule> & rules, const RouteFacts & f, const TargetContexts & c,
                      int64_t need, int64_t node_context) {
    const auto choice = choose_route(rules, f);
    // An upstream would refuse (or cut short) a step longer than its context.
    auto listed = [&](const std::string & pool) {
        return std::any_of(c.pools.begin(), c.pools.end(), [&](const auto & p) { return p.first == pool; });
    };
    auto holds = [&](int64_t ctx) { return ctx <= 0 || need <= ctx; };
    if (choice.target != "cpu" && listed(choice.target) && holds(c.of(choice.target))) return choice.target;
    // A step this node cannot hold goes to a pool that can, whatever the rules say (as the
    // gateway does with requests); none can: it stays here, to be compacted or refused.
    if (node_context > 0 && f.prompt_tokens >= node_context - 1) {
        for (const auto & [name, ctx] : c.pools) {
            if (ctx > 0 && holds(ctx)) return name;
        }
    }
    return {};
}

}  // namespace armada::routing

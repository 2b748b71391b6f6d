#pragma once

// Where a chat or text completion goes when the cluster has GPU pools: the routing rules pick
// `cpu` or a pool from what the request is (its prompt's tokens, counted with the model's
// tokenizer; its max_tokens; its latency class; its model; its tenant). `plan_generation` is that
// choice as a pure function of the request's facts and the targets' contexts; `GenerationRouter`
// gathers the facts, carries the plan out, and falls back to the CPU nodes when a pool is down,
// full or failing and the prompt fits there, saying so in X-Armada-Route.
//
// Owns: the generation plan and its execution. It may include the relay, the pools, the cluster
// view and cluster/pools.h (the rules); never the session routes or the store.

#include "api/auth.h"
#include "api/http_server.h"
#include "cluster/pools.h"
#include "gateway/affinity.h"
#include "gateway/cluster_view.h"
#include "gateway/counters.h"
#include "gateway/pools.h"
#include "gateway/prompt_counter.h"
#include "gateway/relay.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace armada::gateway {

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
int64_t tokens_that_matter(const std::vector<cluster::RouteRule> & rules, const TargetContexts & c);

struct GenerationPlan {
    std::string target;  // "cpu" or a pool
    std::string rule;    // the rule that chose it; "context" when the prompt chose it by size
};

//! Where a generation goes first: the first rule that matches `f` (a body that is not a JSON
//! object goes to `cpu` by `default`, and a node answers it); when the prompt fits neither that
//! target nor the CPU nodes, the first pool that holds it. The prompt may still fit nowhere: the
//! caller checks `prompt_fits` on the target it takes.
GenerationPlan plan_generation(const std::vector<cluster::RouteRule> & rules, const cluster::RouteFacts & f,
                               bool body_is_object, const TargetContexts & c);

class GenerationRouter {
  public:
    using RoutingSource = std::function<std::shared_ptr<const cluster::RoutingConfig>()>;
    //! `counter` may be null (no rule counts tokens).
    GenerationRouter(ClusterView & view, NodeRelay & relay, ChatAffinity & affinity, PoolSet & pools,
                     const PromptCounter * counter, GatewayCounters & counts, RoutingSource routing)
        : view_(view),
          relay_(relay),
          affinity_(affinity),
          pools_(pools),
          counter_(counter),
          counts_(counts),
          routing_(std::move(routing)) {}
    //! Answers a POST of /v1/chat/completions or /v1/completions from `caller`.
    void route(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out, const api::Caller & caller,
               UsageScan * usage);

  private:
    ClusterView & view_;
    NodeRelay & relay_;
    ChatAffinity & affinity_;
    PoolSet & pools_;
    const PromptCounter * counter_;
    GatewayCounters & counts_;
    RoutingSource routing_;
};

}  // namespace armada::gateway

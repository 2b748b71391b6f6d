#pragma once

// Where a chat or text completion goes when the cluster has GPU pools: the routing rules pick
// `cpu` or a pool from what the request is (its prompt's tokens, counted with the model's
// tokenizer; its max_tokens; its latency class; its model; its tenant). The facts are gathered by
// routing/facts.h and the choice is routing::plan_generation (routing/choice.h), a pure function;
// `GenerationRouter` counts the prompt, carries the plan out, and falls back to the CPU nodes
// when a pool is down, full or failing and the prompt fits there, saying so in X-Armada-Route.
//
// Owns: the execution of a generation plan. It may include the relay, routing/ and the cluster
// view; never the session routes or the store.

#include "api/auth.h"
#include "api/http_server.h"
#include "gateway/affinity.h"
#include "gateway/cluster_view.h"
#include "gateway/counters.h"
#include "gateway/prompt_counter.h"
#include "gateway/relay.h"
#include "routing/choice.h"
#include "routing/pool_set.h"
#include "routing/rules.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace armada::gateway {

class GenerationRouter {
  public:
    using RoutingSource = std::function<std::shared_ptr<const routing::RoutingConfig>()>;
    //! `counter` may be null (no rule counts tokens).
    GenerationRouter(ClusterView & view, NodeRelay & relay, ChatAffinity & affinity, routing::PoolSet & pools,
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
    routing::PoolSet & pools_;
    const PromptCounter * counter_;
    GatewayCounters & counts_;
    RoutingSource routing_;
};

}  // namespace armada::gateway

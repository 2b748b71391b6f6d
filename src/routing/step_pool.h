#pragma once

// The port through which an agent step leaves its node for a GPU pool: what a step carries,
// what comes back, the facts the routing rules see, and the interface the agent calls. The
// node's implementation is PoolStepRunner (routing/pool_steps.h); tests replace it.

#include "engine/chat_format.h"
#include "engine/request.h"
#include "engine/sampling.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace armada::routing {

//! One agent step sent to a pool of OpenAI-compatible upstreams (a GPU pool): only the rendered
//! prompt, a token limit and sampling settings leave the node. The loop, the tools and the
//! checkpoints stay here.
struct PoolStep {
    std::string pool;
    std::shared_ptr<const engine::ChatTurn> turn;  // prompt, grammar, stops, parser
    std::vector<common_chat_tool> tools;           // for upstreams that take only `response_format`
    engine::SamplingOptions sampling;              // max_tokens set
    uint32_t seed = 0;
    std::string tenant;
    std::shared_ptr<std::atomic<bool>> cancelled;
    std::string traceparent;  // the step's `chat` span, sent to the upstream ("" : none)
};

//! How a pool step ended. `ran` false: no upstream of the pool gave a whole answer (down, full,
//! failed mid-way); nothing of it counts, and the step may run on the node instead.
struct PoolStepResult {
    bool ran = false;
    bool cancelled = false;
    std::string text;                     // the reply in the model's own format
    std::optional<common_chat_msg> call;  // a call read from a `response_format` reply
    engine::FinishReason finish = engine::FinishReason::Stop;
    int32_t n_prompt = 0, n_generated = 0;
    double ttft_s = 0;
    std::string upstream;  // which one answered (its model name; never its address)
    std::string error;     // why it did not run
};

//! What the routing rules know of an agent step.
struct StepFacts {
    int64_t prompt_tokens = 0;  // exact: the rendered prompt
    int64_t max_tokens = 0;     // the agent's max_tokens_per_step
    bool long_step = false;     // it reads a result of a tool in the agent's long_after_tools
    std::string tenant;         // the session's owner ("t:NAME"), for the tenant's latency class
    std::string model;          // the agent's `model` ("" : none named)
    int64_t node_context = 0;   // tokens a sequence holds on this node (0: not known)
};

//! Sends heavy steps to a pool. Tests replace it; the node's runs them over HTTP.
class StepPool {
  public:
    virtual ~StepPool() = default;
    //! The pool a step goes to under the routing rules ("" for this node). A pool whose context
    //! cannot hold the prompt and max_tokens is not chosen.
    virtual std::string route(const StepFacts & f) const = 0;
    //! The tokens a request may hold on `pool` (prompt and output; 0 when not known).
    virtual int64_t context(const std::string & pool) const = 0;
    //! Runs the step on another thread. `on_text` gets the reply as it streams (nothing once
    //! `done` has run); an empty string says that the text so far is void (an upstream failed
    //! midway, and the step starts again on the next). `done` runs once. Neither may block.
    virtual void run(PoolStep step, std::function<void(std::string)> on_text,
                     std::function<void(PoolStepResult)> done) = 0;
};

}  // namespace armada::routing

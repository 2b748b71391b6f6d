#pragma once

#include "common/clock.h"
#include "engine/chat_format.h"
#include "engine/engine_set.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace armada::agent {

//! The engine as the agent loop sees it. Tests replace it to inject failures.
class GenerationPort {
  public:
    virtual ~GenerationPort() = default;
    virtual engine::SubmitStatus submit(std::unique_ptr<engine::GenRequest> req) = 0;
    virtual void wake() = 0;
    virtual int32_t n_ctx_seq() const = 0;
    //! Session memory: the session will not be back soon (`drop` false) or at all (`drop` true).
    virtual void release(const std::string & /*session*/, bool /*drop*/) {}
    //! The session waits on tools for about `ms`: its KV stays in its sequence until then (0:
    //! parked at once).
    virtual void hold(const std::string & /*session*/, int64_t /*ms*/) {}
    virtual std::optional<engine::KvUsage> kv_usage(const std::string & /*session*/) const { return std::nullopt; }
    virtual uint64_t kv_bytes_per_token() const { return 0; }
    //! True while the node's KV memory is past its high watermark: new sessions wait.
    virtual bool kv_pressure() const { return false; }
};

//! Adapts the node's real engines (one or more; the set routes each session to its engine).
class EnginePort : public GenerationPort {
  public:
    explicit EnginePort(engine::EngineSet & e) : e_(e) {}
    //! One engine alone (tests).
    explicit EnginePort(engine::Engine & e) : own_(std::make_unique<engine::EngineSet>(e)), e_(*own_) {}
    engine::SubmitStatus submit(std::unique_ptr<engine::GenRequest> req) override { return e_.submit(std::move(req)); }
    void wake() override { e_.wake(); }
    int32_t n_ctx_seq() const override { return e_.n_ctx_seq(); }
    void release(const std::string & session, bool drop) override { e_.release(session, drop); }
    void hold(const std::string & session, int64_t ms) override { e_.hold(session, ms); }
    std::optional<engine::KvUsage> kv_usage(const std::string & session) const override { return e_.kv_usage(session); }
    uint64_t kv_bytes_per_token() const override { return e_.kv_bytes_per_cell(); }
    bool kv_pressure() const override { return e_.kv_pressure(); }

  private:
    std::unique_ptr<engine::EngineSet> own_;
    engine::EngineSet & e_;
};

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

//! Wall clock in milliseconds since the epoch; tests inject a fake one.
class Clock {
  public:
    virtual ~Clock() = default;
    virtual int64_t now_ms() const = 0;
};

class SystemClock : public Clock {
  public:
    int64_t now_ms() const override { return common::wall_ms(); }
};

}  // namespace armada::agent

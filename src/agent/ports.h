#pragma once

#include "common/clock.h"
#include "engine/chat_format.h"
#include "engine/engine_set.h"
#include "routing/step_pool.h"

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

// The pool-step port (PoolStep, PoolStepResult, StepFacts, StepPool) is routing's: the node's
// pool runner implements it there, below the agent.
using routing::PoolStep;
using routing::PoolStepResult;
using routing::StepFacts;
using routing::StepPool;

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

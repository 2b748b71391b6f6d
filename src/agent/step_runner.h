#pragma once

// The step runner: builds a model step's prompt, runs it on this node's engine or a GPU pool,
// and turns its reply into tool calls or an answer. Also the turn's trace spans.

#include "agent/agent_spec.h"
#include "agent/ports.h"
#include "agent/session_state.h"
#include "agent/session_table.h"
#include "engine/chat_format.h"
#include "obs/metrics.h"

#include <boost/asio/any_io_executor.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace armada::agent {

struct Session;

//! Runs the model steps of the sessions of one table: checks the agent's limits, builds the
//! prompt (compacting it at the session's memory cap), sends it to the engine or to a pool the
//! routing rules pick, and parses what comes back into the step's calls or answer, which it
//! hands to its host to record. A step the engine fails is tried again (twice); one the pool
//! cannot take runs here if it fits, or waits for the pool.
//!
//! Threads: every method runs with the table's lock held, and so does every handler the runner
//! gives its host; the engine's and the pool's events reach it through one strand per step.
class StepRunner {
  public:
    //! What the runner needs of the table that holds the sessions, beyond `later` and `session`.
    class Host : public SessionTable {
      public:
        //! Runs `fn` now, with the table's lock held.
        virtual void locked(const std::function<void()> & fn) = 0;
        //! Whether the session may start a step now (the node is not draining, and the session
        //! is not leaving for another node: it is checkpointed between steps and goes on there).
        virtual bool may_call(const Session & s) const = 0;
        //! Ends the session with `ev` (a limit, or an error), for `reason`.
        virtual void fail(Session & s, SessionEvent ev, const std::string & reason) = 0;
        //! The step ended: its reply is the newest message of the transcript, its calls are in
        //! `s.tools`, and `output` is its `model_output` step. The host records it and goes on.
        virtual void stepped(Session & s, const std::string & output) = 0;
    };

    struct Options {
        //! This node's name, on spans ("" on a single node).
        std::string node;
        //! The served model's name, for traces (an agent that names its own model wins).
        std::string model;
        //! GPU pools: heavy steps (past the routing rules' thresholds) run there. Null: all here.
        StepPool * pool = nullptr;
        //! Tests only: a finished step fails with this probability.
        double test_step_errors = 0;
        //! Called after each step with its tenant and the tokens it used.
        std::function<void(const std::string &, int64_t)> on_tokens;
    };

    //! `alive` is the table's: false once it is gone, and then no event reaches it.
    StepRunner(Host & host, engine::ChatFormat & format, GenerationPort & engine, obs::Registry & metrics,
               const Clock & clock, boost::asio::any_io_executor io, std::shared_ptr<std::atomic<bool>> alive,
               Options opt);

    //! Starts the session's next model step (or ends it at one of its agent's limits).
    void run(Session & s);
    //! Traces: a turn is one `invoke_agent` span, with a `chat` span per model step and an
    //! `execute_tool` span per tool call under it. `end_turn` ends them all (`error` non-empty:
    //! as failed).
    void begin_turn(Session & s);
    void end_turn(Session & s, const std::string & error);
    //! An agent changed: its shared prompt prefix is found again (`tenant` "" for an operator's).
    void forget_agent(const std::string & tenant, const std::string & id);

    //! Model steps' recent latency (a moving average, ms); 0 before the first.
    double recent_ms() const { return step_ms_.load(std::memory_order_relaxed); }
    //! Since the start: steps that finished (failed ones included), the summed latency of those
    //! that succeeded (µs, from a step's first try), and those that failed.
    int64_t steps() const { return steps_.load(); }
    int64_t step_us() const { return step_us_.load(); }
    int64_t errors() const { return errors_.load(); }

  private:
    //! A piece of the step's reply. From a pool (`from_pool`), an empty piece voids the text so far.
    void on_text(const std::string & id, uint64_t gen, std::string text, bool from_pool = false);
    void on_done(const std::string & id, uint64_t gen, engine::GenEvent ev);
    //! Sends the step to `pool`; `on_pool_done` takes the answer.
    void delegate(Session & s, const std::string & pool, std::vector<common_chat_tool> tools,
                  const engine::SamplingOptions & so);
    void on_pool_done(const std::string & id, uint64_t gen, PoolStepResult r);
    //! The session whose model step `gen` is still the one under way; null when it is gone, ended
    //! or moved on (a late callback).
    Session * running(const std::string & id, uint64_t gen);
    //! A model step that ended: parse its calls (or take `call`), record where it ran.
    void finish(Session & s, const engine::GenEvent & ev, const std::string & where, const std::string & upstream,
                std::optional<common_chat_msg> call);
    int32_t shared_prefix(const Session & s, const AgentSpec & a, const std::vector<common_chat_tool> & tools,
                          common_chat_tool_choice choice);
    //! Hands `fn` to the table's lock through `strand` (an engine or pool thread calls this).
    void hand_over(const boost::asio::any_io_executor & strand, std::function<void()> fn);

    Host & host_;
    engine::ChatFormat & format_;
    GenerationPort & engine_;
    obs::Registry & metrics_;
    const Clock & clock_;
    boost::asio::any_io_executor io_;
    std::shared_ptr<std::atomic<bool>> alive_;
    Options opt_;
    std::map<std::string, engine::Tokens> prefixes_;  // tenant|agent|choice → shared prefix
    std::atomic<double> step_ms_{0};
    std::atomic<int64_t> steps_{0}, step_us_{0}, errors_{0};
};

}  // namespace armada::agent

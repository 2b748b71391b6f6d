#pragma once

// The tool runner: sends a step's tool calls, holds them back while this node's lease is not
// current, and hands each result to the table that owns the session.

#include "agent/ports.h"
#include "agent/session_table.h"
#include "engine/scheduler.h"
#include "obs/metrics.h"
#include "tools/tool_transport.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace armada::agent {

struct Session;

//! One tool call of a session's current step.
struct PendingCall {
    tools::ToolCall call;
    bool started = false, done = false;
    int sent_before = 0;  // sent by this copy before a retry came back unsent (the lease wait)
};

//! The tool calls of a session's current step: its `tools` part.
struct ToolCalls {
    std::vector<PendingCall> calls;
    int32_t in_flight = 0;
    //! Cluster mode: the calls wait for this node's lease to be current again.
    bool lease_wait = false;

    bool all_done() const;
};

//! Sends tool calls and takes their results, for the sessions of one table.
//!
//! A call is an effect outside the store, which fencing cannot take back. So while this node's
//! lease may have lapsed (it was stopped or starved past its TTL, and its sessions may have
//! moved on), no call goes out: the calls wait until the lease is current again, and then until
//! the store confirms, by a fenced write of nothing, that the session is still this node's. A
//! retry that falls due meanwhile comes back unsent and waits the same way.
//!
//! Threads: every method runs with the table's lock held, and so does every handler the runner
//! gives its host; the transport's callbacks only post.
class ToolRunner {
  public:
    //! What the runner needs of the table that holds the sessions, beyond `later` and `session`.
    class Host : public SessionTable {
      public:
        //! Whether the session may start calls now (the node is not draining, and the session is
        //! not leaving for another node: its calls are in the log, and its next node sends them).
        virtual bool may_call(const Session & s) const = 0;
        //! A fenced write of nothing: `then` runs once the store confirmed the session is still
        //! this node's (a node that lost it is fenced, and stops it).
        virtual void confirm_held(Session & s, std::function<void(Session &)> then) = 0;
        //! Call `pc` ended with `r`, now marked done; `all` when it was the step's last. The host
        //! records the result and goes on.
        virtual void finished(Session & s, const PendingCall & pc, const tools::ToolResult & r, bool all) = 0;
        //! A result came back for a session that no longer waits on tools.
        virtual void stray_result(Session & s) = 0;
    };

    struct Options {
        //! Whether this node's lease is surely alive by its own clock. Unset: always.
        std::function<bool()> lease_current;
        //! Keep a session's KV in its sequence while its tools run, for as long as they usually
        //! take (`engine.hold`). False: the engine's idle grace alone decides.
        bool hold_tools = true;
        engine::KvHold::Options kv_hold;
    };

    //! `alive` is the table's: false once it is gone, and then no callback reaches it.
    ToolRunner(Host & host, tools::ToolTransport & transport, GenerationPort & engine, obs::Registry & metrics,
               std::shared_ptr<std::atomic<bool>> alive, Options opt);

    //! Sends the calls of `s` that have not gone out, or waits for the lease first.
    void run(Session & s);
    //! Takes the result of the call `key` of session `id` (lock held).
    void on_result(const std::string & id, const std::string & key, tools::ToolResult r);
    //! Tool calls that ended in an error, since the start.
    int64_t errors() const { return errors_.load(); }

  private:
    void wait_for_lease(const std::string & id);
    void send(Session & s);
    //! The key a tool's latencies are learned under (`hold_`).
    static std::string hold_key(const Session & s, const std::string & tool);

    Host & host_;
    tools::ToolTransport & transport_;
    GenerationPort & engine_;
    obs::Registry & metrics_;
    std::shared_ptr<std::atomic<bool>> alive_;
    Options opt_;
    engine::KvHold hold_;  // tools' observed latencies (thread-safe)
    std::atomic<int64_t> errors_{0};
};

}  // namespace armada::agent

#pragma once

#include "agent/agent_registry.h"
#include "agent/agent_spec.h"
#include "agent/event_stream.h"
#include "agent/outcome.h"
#include "agent/placement.h"
#include "agent/ports.h"
#include "agent/prompt_builder.h"
#include "agent/session_log.h"
#include "agent/session_state.h"
#include "agent/step_runner.h"
#include "agent/tool_runner.h"
#include "engine/chat_format.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "store/store.h"
#include "tools/tool_transport.h"

#include <boost/asio/any_io_executor.hpp>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace armada::agent {

//! A session as callers see it.
struct SessionView {
    std::string id, agent_id, state, reason;
    std::string transcript;  // JSON array of OpenAI-style messages
    std::vector<store::StepRecord> steps;
    int32_t model_steps = 0;
    int64_t prompt_tokens = 0, completion_tokens = 0;
    int64_t created_ms = 0;
    //! Session memory: where its KV is now, and its size after each model step.
    std::optional<engine::KvUsage> kv;
    struct KvPoint {
        int32_t step = 0;
        int64_t tokens = 0;
        uint64_t bytes = 0;
    };
    std::vector<KvPoint> kv_history;
    int32_t compactions = 0;
    //! Cluster mode: the node that holds it and under which epoch ("" and 0 on a single node).
    std::string node;
    int64_t epoch = 0;
};

//! Settings of the manager.
struct SessionOptions {
    //! Ended sessions and stored responses are deleted this long after their last change;
    //! 0 keeps them forever.
    int64_t ttl_ms = 30LL * 24 * 3600 * 1000;
    //! Chain survival is measured over this window, rebuilt from the store at start.
    int64_t survival_window_ms = 3600 * 1000;
    //! Cluster mode: this node's name. Every checkpoint is then fenced by the session's
    //! assignment (this node, its epoch); a session whose write is refused stops here at once.
    //! Empty on a single node: nothing is fenced.
    std::string node;
    //! Cluster mode: this node's cell, written into the rows of sessions created here.
    std::string cell;
    //! Cluster mode: whether this node's lease is surely alive by its own clock. While it is
    //! not (the process was stopped or starved past the TTL), tool calls wait, and go out only
    //! once it is again and the store confirms the session is still this node's. Unset: always.
    std::function<bool()> lease_current;
    //! Cluster mode: whether `node` of `cell` holds a live lease now (1), not (0), or cannot be
    //! told (-1: etcd does not answer). A request for a session another node holds is answered
    //! 409 naming that node while it lives (503 while this cannot be told); the session is taken
    //! over here only once that node is gone. Unset: a holder that is not this node counts as gone.
    std::function<int(const std::string & cell, const std::string & node)> holder_live;
    //! Called once a session's final state is durable (id, state name), under the manager's lock:
    //! it must only hand the news on (a cluster node queues an event for its brain).
    std::function<void(const std::string &, const std::string &)> on_ended;
    //! Called after each model step with its tenant and the tokens it used (prompt and
    //! generated), under the manager's lock: it must only hand the news on (a cluster node
    //! charges them to the tenant's tokens-per-minute quota).
    std::function<void(const std::string &, int64_t)> on_tokens;
    //! GPU pools: heavy steps (past the routing rules' thresholds) run there. Null: all here.
    StepPool * pool = nullptr;
    //! The served model's name, for traces (an agent that names its own model wins).
    std::string model;
    //! Tests only (`serve --test-step-errors P`): a finished model step fails with probability
    //! P, as a bad build's would, so a rollout's gates have something to catch.
    double test_step_errors = 0;
    //! How long a session's KV stays in its sequence while it waits on tools, learned per tool
    //! (engine::KvHold). `hold_tools` false: the engine's idle grace alone decides.
    bool hold_tools = true;
    engine::KvHold::Options kv_hold;
};

//! What the node counted since it started, for a rollout's gates (carried in its load report).
struct StepSignals {
    int64_t steps = 0;         // model steps that finished, failed ones included
    double step_s = 0;         // latency of those that succeeded (from a step's first try), summed
    int64_t completed = 0;     // sessions that ended completed
    int64_t failed = 0;        // ended failed or timed out (cancels count on neither side)
    int64_t model_errors = 0;  // model steps that failed
    int64_t tool_errors = 0;   // tool calls that ended in an error
    int64_t store_errors = 0;  // checkpoint writes that failed
};

struct Session;  // session.h: the session in named parts

//! Runs agent sessions: model step → tool calls → model step … → answer, with every state change
//! written to the store before anyone hears of it.
//!
//! Threads: public methods may be called from any thread. All session data is guarded by `mu_`;
//! engine, tool and store callbacks never touch it directly but post a handler to the I/O
//! executor, which takes the lock. Nothing blocks while holding it: engine submit, store commit
//! and tool calls only enqueue, and store reads happen before the lock is taken.
//!
//! Memory holds the open sessions, and ended ones only while something uses them (a commit,
//! a stream); an ended session is read from the store when asked for.
//!
//! Parts: the table, its lock and the public requests are the manager's own
//! (session_manager.cpp), and so is how a session goes from one part to the next
//! (session_host.cpp). Four parts are classes of their own, to which the manager is the host:
//! the session log (`SessionLog`, session_log.h: records, checkpoints, the outbox, rebuilding
//! from the store), the step runner (`StepRunner`, step_runner.h: model steps, here or on a
//! pool, and the turn's spans), the tool runner (`ToolRunner`, tool_runner.h: tool calls and the
//! lease gate) and the placement (`Placement`, placement.h: resume, adopt, moves and fencing).
//! `Session` (session.h) keeps each part's state in a member of its own.
//!
//! Tenants: `tenant` names the caller's tenant. A session, and an agent declared through the
//! API, belong to one tenant; another tenant is told they do not exist.
class SessionManager : private SessionLog::Host,
                       private StepRunner::Host,
                       private ToolRunner::Host,
                       private Placement::Host {
  public:
    SessionManager(engine::ChatFormat & format, GenerationPort & engine, store::Store & store,
                   tools::ToolTransport & tools, boost::asio::any_io_executor io, obs::Registry & metrics,
                   const Clock & clock, SessionOptions opt = {});
    ~SessionManager() override;

    // ---- agents ----
    //! Registers an agent from the operator's file (visible to every tenant, read-only).
    void put_operator_agent(AgentSpec spec);
    //! Registers or replaces `tenant`'s agent and stores its canonical JSON, so it is there again
    //! after a restart; `done` runs once it is durable. 403 for an operator agent's id.
    void declare_agent(AgentSpec spec, const std::string & tenant, std::function<void(Outcome)> done);
    //! Deletes `tenant`'s agent; its running sessions finish with the spec they started with.
    void delete_agent(const std::string & tenant, const std::string & id, std::function<void(Outcome)> done);
    //! Loads the agents declared through the API before the last stop. `prepare` completes each
    //! (MCP tools); returns how many. `present`, when given, receives (tenant, id) of every
    //! stored agent, and is left empty with false returned through `read_ok` when the read failed.
    size_t load_declared_agents(const std::function<std::string(AgentSpec &)> & prepare,
                                std::set<std::pair<std::string, std::string>> * present = nullptr,
                                bool * read_ok = nullptr);
    //! The agents `tenant` sees: the operator's and its own. `all_tenants` (admin): every agent.
    //! In cluster mode both read agents declared through other nodes from the store first.
    std::vector<AgentSpec> agents(const std::string & tenant, bool all_tenants = false);
    //! The agent `id` as `tenant` sees it.
    std::optional<AgentSpec> agent(const std::string & tenant, const std::string & id);
    //! Whether `id` is an operator agent.
    bool is_operator_agent(const std::string & id) const;

    // ---- sessions ----
    //! Creates a session; `done` runs once it is durable, with its id (or an error). `trace`: the
    //! request's trace context, the parent of the turn's `invoke_agent` span.
    void create(const std::string & agent_id, const std::string & tenant, const std::string & input,
                std::function<void(Outcome)> done, std::optional<obs::TraceContext> trace = std::nullopt);
    //! Adds a user turn to a session that finished its last turn or waits for input.
    void add_message(const std::string & id, const std::string & tenant, const std::string & text,
                     std::function<void(Outcome)> done, std::optional<obs::TraceContext> trace = std::nullopt);
    std::optional<SessionView> get(const std::string & id, const std::string & tenant);
    //! A tenant's sessions from the store (every node's, in a cluster), newest first: at most
    //! `limit`, only those in `state` unless it is empty. Nullopt when the store cannot be read.
    std::optional<std::vector<store::SessionRecord>> list(const std::string & tenant, const std::string & state,
                                                          size_t limit) {
        return store_.sessions_of(tenant, state, limit);
    }
    void cancel(const std::string & id, const std::string & tenant, std::function<void(Outcome)> done);
    void erase(const std::string & id, const std::string & tenant, std::function<void(Outcome)> done);

    //! Cluster mode: the answer for a request about a session this node does not have and another
    //! live node holds (409 naming it; 503 while that cannot be told). Nullopt: serve it here.
    std::optional<Outcome> held_elsewhere(const std::string & id, const std::string & tenant);

    //! Replays the events after `after`, then delivers new ones until the session ends or the
    //! returned handle is released. `fn` must not block; `end` runs once when the stream closes.
    //! Returns 0 when the session is unknown to `tenant`.
    uint64_t subscribe(const std::string & id, const std::string & tenant, EventId after,
                       std::function<void(const SessionEventRecord &)> fn, std::function<void()> end);
    void unsubscribe(const std::string & id, uint64_t handle);

    //! Loads every session that had not ended and continues it from its last durable step.
    //! In cluster mode, only those assigned to this node. Returns how many were resumed.
    size_t resume_all();

    // ---- cluster ----
    //! The cell brain assigned session `id` to this node under `epoch`: load it from the store and
    //! run it from its last checkpoint. Ignored (false) when the store says otherwise (a late or
    //! repeated command) or the session has ended; true when it runs here now.
    //! `moved`: it came from another node that had it between steps; written as a "moved" step
    //! before it goes on.
    bool adopt(const std::string & id, int64_t epoch, std::optional<obs::TraceContext> trace = std::nullopt,
               std::optional<MoveNote> moved = std::nullopt);
    //! A session on its way here (its KV is being fetched): `adopt_assigned` leaves it alone
    //! meanwhile, so it is not started before its KV is in place.
    void incoming(const std::string & id, bool on);
    //! The sessions this node offers its cell's brain to move now, with their epochs: none of
    //! their steps, tool calls or writes is under way. Draining (cluster mode): every open
    //! session the store gives this node. Otherwise those `offer_to_move` picked.
    using Movable = agent::Movable;
    std::vector<Movable> movable();
    //! The node's KV is past its high watermark: up to `n` sessions (those holding the most KV,
    //! waiting for tools first) stop before their next step, to be offered for a move with
    //! their KV (a rebalance). Returns how many were picked.
    size_t offer_to_move(size_t n);
    //! Offered sessions still here and still this node's after `after_ms` (no node had room for
    //! them, or the pressure passed: `after_ms` 0) go on here. Returns how many.
    size_t stay_unmoved(int64_t after_ms);
    //! Open sessions the store assigns to this node (cluster mode); nullopt when the store
    //! cannot be read.
    std::optional<size_t> open_here();
    //! Whether a step, tool call or write of the session is under way here.
    bool busy(const std::string & id) const;
    //! Whether the store gives the open session to another node than this one; nullopt when the
    //! store cannot be read (false too when it has no such session).
    std::optional<bool> held_elsewhere(const std::string & id);
    //! Level-triggered half of `adopt`: runs every open session the store assigns to this node
    //! that is not running here (a command lost, or a read that failed while PostgreSQL
    //! restarted). After the first call, only an assignment seen by the call before too: a
    //! brain writes the row before it sends the command (which may be a move whose KV comes
    //! first), so a fresh one is the command's to carry out. Returns how many it started.
    //! One caller thread.
    size_t adopt_assigned();
    static std::string new_id();
    //! The trace a session is in, as its record keeps it (the `traceparent` of its current or
    //! last turn): a brain that moves the session continues that trace. Cheap enough to run
    //! over every open row at each reconcile; nullopt when the record holds none.
    static std::optional<obs::TraceContext> record_trace(std::string_view data) {
        return obs::TraceContext::in_record(data);
    }
    //! Sessions whose writes were refused because another node holds them now.
    size_t fenced_sessions() const { return placement_.fenced(); }

    // ---- lifecycle ----
    //! Stops starting work: new sessions and messages get 503; a step that ends is checkpointed
    //! and its session waits for the next start. Steps and tool calls running now finish.
    void drain();
    //! True when nothing runs: no model step, no tool call, no checkpoint being written.
    bool quiet() const;
    //! Deletes ended sessions (and stored responses) older than the TTL, at most `limit` now.
    //! Returns how many were deleted (once their batch is durable, counted in metrics).
    size_t expire_old(size_t limit = 1000);

    //! Counts for metrics and tests.
    size_t live_sessions() const;
    //! Open sessions in memory by state (queued, running, waiting_tool, waiting_input).
    std::map<std::string, int> live_by_state() const;
    //! Model steps' recent latency on this node (a moving average, ms); 0 before the first.
    double recent_step_ms() const { return step_runner_.recent_ms(); }
    StepSignals signals() const;
    //! Open sessions in memory: (id, tenant).
    std::vector<std::pair<std::string, std::string>> live_owners() const;
    size_t sessions_in_memory() const;

  private:
    // ---- the table (session_manager.cpp) ----
    Session * find(const std::string & id, const std::string & tenant);
    //! Another live node holds the session (`node`), or whether it does cannot be told now.
    struct HeldElsewhere {
        std::string node, why;
        bool unknown = false;
        bool any() const { return !node.empty() || unknown; }
        //! The answer to a request for the session here.
        Outcome outcome(const std::string & id) const;
    };
    //! `find`, else read the session from the store (outside the lock) and keep it in memory.
    Session * find_or_load(std::unique_lock<std::mutex> & lk, const std::string & id, const std::string & tenant,
                           HeldElsewhere * held = nullptr);
    //! Whether another node that lives holds `rec` (cluster mode): `held` says which.
    bool held_by_other(const store::SessionRecord & rec, HeldElsewhere & held) const;
    bool apply(Session & s, SessionEvent ev, const std::string & reason = {});
    void fail(Session & s, SessionEvent ev, const std::string & reason) override;
    void count_outcome(const Session & s);
    void count_state(SessionState st, int delta);
    void note_ended(SessionState st, int64_t at_ms);
    void update_survival();
    void maybe_evict(Session & s);
    void sync_memory_gauge();
    //! Runs `fn` on `on` (default: the I/O pool) unless the manager is gone by then.
    void post(std::function<void()> fn, const boost::asio::any_io_executor & on = {});
    void after_ms(int ms, std::function<void()> fn);

    // ---- the host of the session log, the step runner, the tool runner and the placement
    // (session_host.cpp) ----
    void later(int ms, std::function<void()> fn) override;
    void locked(const std::function<void()> & fn) override;
    void stepped(Session & s, const std::string & output) override;
    void later_unlocked(int ms, std::function<void()> fn) override;
    Session * session(const std::string & id) override;
    void fenced(Session & s, const std::string & why) override;
    void written(Session & s) override;
    bool may_call(const Session & s) const override;
    void confirm_held(Session & s, std::function<void(Session &)> then) override;
    void finished(Session & s, const PendingCall & pc, const tools::ToolResult & r, bool all) override;
    void stray_result(Session & s) override;
    std::unique_lock<std::mutex> lock() override;
    std::vector<Session *> all_sessions() override;
    bool draining() const override;
    void install(std::unique_ptr<Session> s) override;
    void drop(Session & s, const std::string & error) override;
    //! Continues a session loaded from the store (after a restart, or assigned by the brain).
    void resume(Session & s) override;

    engine::ChatFormat & format_;
    GenerationPort & engine_;
    store::Store & store_;
    tools::ToolTransport & tools_;
    boost::asio::any_io_executor io_;
    obs::Registry & metrics_;
    const Clock & clock_;
    SessionOptions opt_;

    mutable std::mutex mu_;
    AgentRegistry agents_;                                      // its own lock, taken inside mu_
    std::map<std::string, std::unique_ptr<Session>> sessions_;  // guarded by mu_
    uint64_t next_sub_ = 1;                                     // guarded by mu_
    bool draining_ = false;                                     // guarded by mu_
    std::map<SessionState, int64_t> live_counts_;               // guarded by mu_
    std::set<std::string> expiring_;                            // being deleted by retention; mu_
    //! Ended sessions per minute over the survival window: (minute, completed, failed, cancelled).
    struct Minute {
        int64_t minute = 0;
        std::array<int64_t, 3> n{};
    };
    std::vector<Minute> window_;  // guarded by mu_
    //! False once the manager is gone; read by engine, tool, store and pool threads.
    std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
    SessionLog log_;          // after alive_, which it is given
    StepRunner step_runner_;  // the same
    ToolRunner tool_runner_;  // the same
    Placement placement_;
    // signals()
    std::atomic<int64_t> sig_completed_{0}, sig_failed_{0};
};

}  // namespace armada::agent

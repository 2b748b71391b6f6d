#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace armada::store {

//! Outcome of a store operation. Success carries no message.
struct Status {
    bool ok = true;
    std::string error;
    //! The batch was refused because a session it writes is no longer this writer's (another
    //! node holds a newer epoch). Not a store failure: nothing becomes sticky.
    bool fenced = false;
    //! Fenced by `Batch::leader`: a newer leader of the brain's election has written.
    bool deposed = false;
    static Status Ok() { return {}; }
    static Status Error(std::string e) { return {false, std::move(e)}; }
    static Status Fenced(std::string e) { return {false, std::move(e), true}; }
    static Status Deposed(std::string e) { return {false, std::move(e), true, true}; }
};

//! The durable record of one session; the agent room owns the meaning of `state` and `data`.
struct SessionRecord {
    std::string id;
    std::string agent_id;
    std::string owner;   // hash of the API key that created it, "" when auth is off
    std::string state;   // session state name
    std::string reason;  // why it ended, when it did
    std::string data;    // agent-owned serialised extras (usage, limits in force)
    int64_t created_ms = 0;
    int64_t updated_ms = 0;
    // The assignment: which node runs it, under which epoch. Written only by `Batch::assign`;
    // an upsert of the record leaves them as they are. Empty and 0 on a single node.
    std::string node;
    int64_t epoch = 0;
    //! The cell it belongs to in a cluster ("" on a single node). Set when the row is first
    //! written; an upsert of an existing row leaves it.
    std::string cell;
};

//! One entry of a session's append-only step log.
struct StepRecord {
    std::string session_id;
    int64_t seq = 0;          // 1, 2, 3… within the session; the log's order
    std::string kind;         // user_input, model_output, tool_call, tool_result, state
    std::string payload;      // agent-owned serialised body
    std::string idempotency;  // tool calls: <session>:<step>:<call>
    int64_t ts_ms = 0;
};

//! An agent declared through the API: its canonical JSON, under its tenant, and the tools its
//! MCP servers listed when it was declared (JSON), so a restart needs no server to answer.
struct AgentRecord {
    std::string tenant;
    std::string id;
    std::string spec;
    std::string tools;
    int64_t created_ms = 0;
    int64_t updated_ms = 0;
};

//! A response stored by the Responses API (`store: true`), under its tenant.
struct ResponseRecord {
    std::string id;
    std::string tenant;
    std::string data;  // the response and its conversation, JSON
    int64_t created_ms = 0;
};

//! A session's assignment to a node under an epoch (a fencing token that only grows).
struct Assignment {
    std::string session_id;
    std::string node;
    int64_t epoch = 0;
    //! Non-empty in `Batch::assign`: the session is re-homed to this cell (a lost cell's sessions,
    //! by the global brain), with `node` empty until that cell's brain places it.
    std::string cell{};
};

//! What one commit writes atomically: session upserts plus step appends.
struct Batch {
    std::vector<SessionRecord> sessions;
    std::vector<StepRecord> steps;
    std::vector<std::string> erase;                                 // session ids to delete with their steps
    std::vector<AgentRecord> agents;                                // upserts
    std::vector<std::pair<std::string, std::string>> erase_agents;  // (tenant, id)
    std::vector<ResponseRecord> responses;                          // upserts
    std::vector<std::string> erase_responses;
    //! Fencing: the batch is written only if each of these sessions is still assigned to exactly
    //! this node and epoch, checked under the session row's lock in the same transaction. If one
    //! is not, nothing of the batch is written and the commit reports `Status::fenced`.
    std::vector<Assignment> fences;
    //! Moves sessions to a node under a new epoch; an assignment whose epoch is not greater than
    //! the stored one is refused (fenced), so a late or repeated decision never goes backwards.
    std::vector<Assignment> assign;
    //! Writes a probe row and nothing else matters: readiness asks whether a write goes through.
    bool probe = false;
    //! A brain's leadership (its election and etcd revision, its fencing epoch): when set, the
    //! batch is written only if no leader with a greater revision has written to the store, and it
    //! raises the mark to its own. A deposed brain that has not noticed yet is refused (fenced)
    //! once its successor wrote. With shards, each shard the batch touches holds its own mark:
    //! a new leader writes one batch to every shard (with `probe`) before anything else.
    struct Leadership {
        std::string election;
        int64_t rev = 0;  // 0: not a brain's batch
    } leader;
    //! Deletes every election's leader mark (on each shard the batch touches; with `probe`, on
    //! all). The recovery after etcd's revisions went backwards (a restore from a snapshot, a new
    //! member set): until then every new leader's mark is below the old one and refused. Run it
    //! only once no brain that led under the old etcd still runs (`armada cluster forget-leaders`).
    bool forget_leaders = false;
};

//! The error of a batch refused by its `leader` fence.
std::string leader_fenced(const Batch::Leadership & l);

//! How a store's connection pools have been waited on (PostgreSQL; SQLite has none).
struct PoolStats {
    size_t size = 0, in_use = 0;
    uint64_t acquired = 0;  // reads that took a connection
    uint64_t waited = 0;    // of which found none free and waited
    uint64_t wait_us = 0;   // total time spent waiting
    uint64_t timeouts = 0;  // gave up after the pool's wait limit
    uint64_t reconnects = 0;
};

//! The session log: one session's record and steps, a stored response, the agents declared
//! through the API, and the writes that change them. `commit` is durable when its callback
//! reports ok: nothing is acknowledged before it is on disk. Implementations may group commits
//! that arrive together. A failed write is sticky until `recover` succeeds: later commits fail
//! too, none silently succeed. All methods are thread-safe; callbacks run on the store's own
//! thread and must not block.
class SessionLog {
  public:
    virtual ~SessionLog() = default;
    virtual void commit(Batch batch, std::function<void(Status)> done) = 0;
    //! Blocks until the batch is durable (tests, start-up).
    Status commit_sync(Batch batch);

    virtual std::optional<SessionRecord> session(const std::string & id) = 0;
    //! Whether session `id`'s row exists; nullopt when the store could not be read (`session`
    //! says nothing in both cases). A store whose reads cannot fail need not override it.
    virtual std::optional<bool> has_session(const std::string & id) { return session(id).has_value(); }
    virtual std::optional<ResponseRecord> response(const std::string & id) = 0;
    virtual std::vector<StepRecord> steps(const std::string & id) = 0;
    //! Every agent declared through the API; nullopt when the read failed (an empty table is an
    //! empty vector), so a caller never takes an outage for "every agent was deleted".
    virtual std::optional<std::vector<AgentRecord>> agents() = 0;
    //! Clears a sticky failure if the store works again.
    virtual Status recover() = 0;
    //! A sticky failure, if the store has one (cheap; readiness then commits a probe batch).
    virtual Status writable() = 0;
    //! Its connection pools, if it has any.
    virtual std::optional<PoolStats> pool_stats() const { return std::nullopt; }
};

//! Queries over many sessions: what is open, and where (a cell brain's reconcile, a node's own
//! check), a tenant's list, what retention deletes, and what ended when (chain survival).
class SessionQueries {
  public:
    virtual ~SessionQueries() = default;
    //! Sessions whose state is not one of `ended_states`, oldest first.
    virtual std::vector<SessionRecord> sessions_not_in(const std::vector<std::string> & ended_states) = 0;
    //! The same, only those of `cell` and, if `node` is not empty, assigned to `node` (a cell
    //! brain's reconcile, a node's own check). The default filters `sessions_not_in`. Nullopt
    //! when the read failed (a shard could not be reached), so that no caller takes an outage
    //! for "no session is open".
    virtual std::optional<std::vector<SessionRecord>> open_sessions(const std::string & cell, const std::string & node,
                                                                    const std::vector<std::string> & ended_states);
    //! The ids of `owner`'s sessions not in `ended` (agent sessions only, not stored responses);
    //! nullopt when the read failed. The default filters `sessions_of` (nullopt for an owner with
    //! more rows than it returns).
    virtual std::optional<std::vector<std::string>> open_ids_of(const std::string & owner,
                                                                const std::vector<std::string> & ended);
    //! A tenant's sessions (agent sessions, not stored agents or responses), newest first, at most
    //! `limit`, only those in `state` unless it is empty. Nullopt when the read failed.
    virtual std::optional<std::vector<SessionRecord>> sessions_of(const std::string & owner, const std::string & state,
                                                                  size_t limit) = 0;
    //! Ids of up to `limit` sessions in one of `states` last updated before `before_ms`.
    virtual std::vector<std::string> expired(const std::vector<std::string> & states, int64_t before_ms,
                                             size_t limit) = 0;
    //! Ids of up to `limit` stored responses created before `before_ms`.
    virtual std::vector<std::string> expired_responses(int64_t before_ms, size_t limit) = 0;
    //! Sessions in one of `states` last updated at or after `since_ms`, counted per state and
    //! minute (`updated_ms / 60000`). Only agent sessions, not `@…` records (stored responses).
    struct MinuteCount {
        std::string state;
        int64_t minute = 0;
        int64_t count = 0;
    };
    virtual std::vector<MinuteCount> count_since(const std::vector<std::string> & states, int64_t since_ms) = 0;
    //! Sessions that ended (completed, failed or cancelled) since `since_ms`, counted by cell, state,
    //! whether a deadline ended them and whether they had moved (epoch above 1); in `cell` only
    //! when it is not empty. For the chain survival rate of cells and of the cluster. nullopt when
    //! a shard could not be read (a partial count would pass for the whole).
    struct EndedCount {
        std::string cell;
        std::string state;
        bool deadline = false;
        bool moved = false;
        int64_t count = 0;
    };
    virtual std::optional<std::vector<EndedCount>> ended_since(const std::string & cell, int64_t since_ms) = 0;
};

//! The checkpoint store: the session log and the queries over it, which every backend (SQLite,
//! PostgreSQL, memory) serves together. A caller that needs one side takes that interface.
class Store : public SessionLog, public SessionQueries {};

//! A store that passes every call to another; wrappers (fault injection, crash hooks) override
//! only what they change.
class ForwardingStore : public Store {
  public:
    explicit ForwardingStore(Store & inner) : inner_(inner) {}
    void commit(Batch batch, std::function<void(Status)> done) override {
        inner_.commit(std::move(batch), std::move(done));
    }
    std::optional<SessionRecord> session(const std::string & id) override { return inner_.session(id); }
    std::optional<bool> has_session(const std::string & id) override { return inner_.has_session(id); }
    std::optional<ResponseRecord> response(const std::string & id) override { return inner_.response(id); }
    std::vector<StepRecord> steps(const std::string & id) override { return inner_.steps(id); }
    std::vector<SessionRecord> sessions_not_in(const std::vector<std::string> & ended) override {
        return inner_.sessions_not_in(ended);
    }
    std::optional<std::vector<SessionRecord>> open_sessions(const std::string & cell, const std::string & node,
                                                            const std::vector<std::string> & ended) override {
        return inner_.open_sessions(cell, node, ended);
    }
    std::optional<std::vector<std::string>> open_ids_of(const std::string & owner,
                                                        const std::vector<std::string> & ended) override {
        return inner_.open_ids_of(owner, ended);
    }
    std::optional<std::vector<SessionRecord>> sessions_of(const std::string & owner, const std::string & state,
                                                          size_t limit) override {
        return inner_.sessions_of(owner, state, limit);
    }
    std::optional<std::vector<AgentRecord>> agents() override { return inner_.agents(); }
    std::vector<std::string> expired(const std::vector<std::string> & states, int64_t before_ms,
                                     size_t limit) override {
        return inner_.expired(states, before_ms, limit);
    }
    std::vector<std::string> expired_responses(int64_t before_ms, size_t limit) override {
        return inner_.expired_responses(before_ms, limit);
    }
    std::optional<std::vector<EndedCount>> ended_since(const std::string & cell, int64_t since_ms) override {
        return inner_.ended_since(cell, since_ms);
    }
    std::vector<MinuteCount> count_since(const std::vector<std::string> & states, int64_t since_ms) override {
        return inner_.count_since(states, since_ms);
    }
    Status recover() override { return inner_.recover(); }
    Status writable() override { return inner_.writable(); }
    std::optional<PoolStats> pool_stats() const override { return inner_.pool_stats(); }

  protected:
    Store & inner_;
};

}  // namespace armada::store

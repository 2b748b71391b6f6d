#pragma once

#include "store/cluster_store.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

struct pg_conn;

namespace armada::store {

//! The cluster's store: PostgreSQL, with the same promise as SQLite (a commit's callback reports
//! ok only after COMMIT returned). Per shard, one writer connection and thread take everything
//! queued and commit it in one transaction (group commit); each batch sits in its own savepoint,
//! so one that is fenced is undone alone. Reads use a pool of connections per shard.
//!
//! Fencing: each write of a session named in the batch's `fences` is one conditional statement
//! (the row's `UPDATE … WHERE node AND epoch`; each step `INSERT … SELECT FROM sessions WHERE node
//! AND epoch FOR UPDATE`). The row stays locked until COMMIT, so an assignment to a new epoch
//! either commits before (the write does nothing and the batch is refused) or waits until after.
//!
//! Schema migrations are versioned in `armada_schema` and applied at open under an advisory lock,
//! so nodes starting together do not race. A batch that touches several shards is committed per
//! shard (not atomically across them); the agent layer writes one session per batch.
class PostgresStore : public ClusterStore {
  public:
    static std::unique_ptr<PostgresStore> open(const PostgresConfig & cfg, std::string & error);
    ~PostgresStore() override;

    void commit(Batch batch, std::function<void(Status)> done) override;
    std::optional<SessionRecord> session(const std::string & id) override;
    std::optional<bool> has_session(const std::string & id) override;
    std::optional<ResponseRecord> response(const std::string & id) override;
    std::vector<StepRecord> steps(const std::string & id) override;
    std::vector<SessionRecord> sessions_not_in(const std::vector<std::string> & ended_states) override;
    std::optional<std::vector<SessionRecord>> sessions_of(const std::string & owner, const std::string & state,
                                                          size_t limit) override;
    //! The query open_sessions runs on each shard (for EXPLAIN in tests and benchmarks): its
    //! parameters are the cell, then the node when `by_node`, after any ended state that is not
    //! written as a literal; `params_used` says how many there are.
    static std::string open_sessions_sql(const std::vector<std::string> & ended, bool by_node, size_t & params_used);
    //! The query ended_since runs on each shard (for EXPLAIN in tests): its parameters are the
    //! window's start, then the cell when `by_cell`.
    static std::string ended_since_sql(bool by_cell);
    std::optional<std::vector<SessionRecord>> open_sessions(const std::string & cell, const std::string & node,
                                                            const std::vector<std::string> & ended_states) override;
    //! "state NOT IN (…)": the literal the `sessions_open` index is defined with when `ended` is
    //! that set, else parameters from $`first_param` (advanced past them).
    static std::string open_where(const std::vector<std::string> & ended, size_t & first_param);
    //! `sql` (a SELECT of session rows) on every shard, all rows together; nullopt when a shard
    //! cannot be read.
    std::optional<std::vector<SessionRecord>> select_open(const std::string & sql,
                                                          const std::vector<std::string> & params);
    std::optional<std::vector<AgentRecord>> agents() override;
    std::vector<std::string> expired(const std::vector<std::string> & states, int64_t before_ms, size_t limit) override;
    std::vector<std::string> expired_responses(int64_t before_ms, size_t limit) override;
    std::vector<MinuteCount> count_since(const std::vector<std::string> & states, int64_t since_ms) override;
    std::optional<std::vector<EndedCount>> ended_since(const std::string & cell, int64_t since_ms) override;
    Status recover() override;
    Status writable() override;

    //! The ids of `owner`'s sessions not in `ended` (API sessions only: not those behind stored
    //! responses), over every shard; nullopt when a shard cannot be read.
    std::optional<std::vector<std::string>> open_ids_of(const std::string & owner,
                                                        const std::vector<std::string> & ended) override;
    // Tenants and their keys (on the first shard), for the gateways.
    std::optional<std::vector<TenantRecord>> tenants() override;
    std::optional<std::vector<KeyRecord>> keys() override;
    AdminResult create_tenant(const TenantRecord & t) override;
    AdminResult update_tenant(const TenantRecord & t) override;
    AdminResult delete_tenant(const std::string & name) override;
    AdminResult create_key(const KeyRecord & k) override;
    AdminResult delete_key(const std::string & id) override;

    size_t shards() const { return shards_.size(); }
    //! Which shard holds a session (or response) id.
    size_t shard_of(const std::string & id) const;
    //! The read pools, summed over shards.
    std::optional<PoolStats> pool_stats() const override;
    //! Commits carried by the last transaction on shard 0 (for tests of group commit).
    size_t last_group_size() const { return last_group_; }
    //! The schema version this build writes.
    static int schema_version();

  private:
    struct Shard;
    class Lease;
    PostgresStore() = default;
    Lease acquire(Shard & s);
    //! `sql` on every shard, each answer handed to `take`; false as soon as a shard cannot be
    //! read (a partial answer would be a wrong one). Defined where it is used.
    template <class Take>
    bool on_every_shard(const std::string & sql, const std::vector<std::string> & params, Take && take);
    void writer_loop(Shard & s);
    std::string apply(Shard & s, const std::vector<Batch *> & group, std::vector<Status> & each);

    PostgresConfig cfg_;
    std::vector<std::unique_ptr<Shard>> shards_;
    std::atomic<size_t> last_group_{0};
};

}  // namespace armada::store

#pragma once

#include "cluster/etcd.h"
#include "cluster/global_brain.h"
#include "cluster/runtime/kv.h"
#include "cluster/runtime/leadership.h"
#include "cluster/survival.h"
#include "obs/metrics.h"
#include "store/store.h"

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace armada::cluster {

//! How far back the brains' chain survival rates look.
constexpr int64_t kSurvivalWindowMs = 3600 * 1000;

//! Chain survival as gauges: per cell in `by_cell` (`armada_cell_*`), and for the whole cluster
//! (its "" entry, `armada_cluster_*`) when `cluster` is set.
void survival_metrics(obs::Registry & m, const std::map<std::string, Survival> & by_cell, bool cluster);

//! A cell's aggregate (what its leading brain reports) as `armada_cell_*` gauges.
void cell_metrics(obs::Registry & m, const CellReport & r);

//! A process that takes turns to lead through an election kept in the key-value store (etcd's
//! election, see election.h). It holds a lease, kept alive on a thread of its own, and follows
//! the election on another (a list, then a watch: who leads, and each change as it happens).
//! - A standby stands under its lease, then waits on the watch until its key is the oldest: no
//!   polling. It stands again when its lease went, after a minute, or on a stop.
//! - A winner checks with `still_leader` that its key is the leader's; `lead` then runs, and
//!   should call `still_leader` about once a second and return when it is false or on a stop.
//!   That check reads what the follower saw, and asks the store only when the follower is away or
//!   saw another leader.
//! - On a stop the leader resigns, then revokes its lease, so a standby leads at once.
//! - The leader's loop calls `beat` each time round. A loop that has not beaten for the stall
//!   limit (`lease_step`) is stuck (a call that hangs): the keep-alive thread then gives the lease
//!   up, so a standby leads within one TTL, and `still_leader` is false when the loop wakes. Its
//!   writes are refused by the store from the moment the new leader marks it.
class Elected {
  public:
    //! Waits up to `ms` for a stop; true once one has come (and from then on).
    using WaitStop = std::function<bool(int ms)>;
    //! `what` names the role in logs ("cell cell0", "global").
    Elected(KvStore & kv, int ttl_s, std::string what, WaitStop wait_stop);
    ~Elected();
    Elected(const Elected &) = delete;
    Elected & operator=(const Elected &) = delete;

    //! Campaigns in `election` as `name` until a stop signal; runs `lead` while it leads. On the
    //! way out the lease is revoked, so a standby leads at once.
    void run(const std::string & election, const std::string & name,
             const std::function<void(const EtcdLeader &)> & lead);
    bool stopping() const { return quit_.load(); }
    //! Waits up to `ms` for a stop; true when one came.
    bool wait_signal(int ms);
    bool still_leader(const EtcdLeader & me, const std::string & election);
    //! The leader's loop is still moving (call it each time round, and between long steps).
    void beat();
    //! Leaderships given up because the loop stopped beating.
    int64_t stalls() const { return stalls_.load(); }
    //! The lease held now (0 while there is none): keys put under it go when this process does.
    int64_t lease() const { return lease_.load(); }
    //! A new leader's first write: its mark (election, etcd revision) on every shard of `st`, so
    //! that the brain it follows, if it still runs unaware, is refused from then on. Retries while
    //! the store is away or refuses (a mark above this revision: etcd's data was wiped), as long
    //! as this process leads; false on a stop or once it no longer leads.
    bool claim_store(store::Store & st, const std::string & election, const EtcdLeader & me);
    //! The brain's metrics: the election's own (leading, leader changes seen) and the brain's.
    obs::Registry & metrics() { return metrics_; }

  private:
    static constexpr int kCampaignMs = 60000;
    void keep_lease();
    void observe(const std::string & election);
    //! One campaign under the lease held now: "" when this process leads (`me` says how).
    std::string campaign(const std::string & election, const std::string & name, EtcdLeader & me);

    KvStore & kv_;
    int ttl_s_;
    std::string what_;
    WaitStop wait_stop_;
    std::atomic<int64_t> lease_{0};
    std::atomic<bool> leading_{false};
    std::atomic<int64_t> beat_ms_{0};
    std::atomic<int64_t> renewed_ms_{0};  // when the lease held now was last renewed (its grant first)
    std::atomic<int64_t> stalls_{0};
    std::atomic<bool> quit_{false};
    std::thread keepalive_;
    std::thread observer_;
    mutable std::mutex seen_mu_;
    std::string seen_key_;    // the leader's key as the follower last saw it ("": nobody leads)
    bool observing_ = false;  // the follower's watch is up
    obs::Registry metrics_;
    std::shared_ptr<void> trace_counts_;  // the tracer counts into metrics_ while this lives
};

//! One term of an `Elected` as a runner sees it.
class ElectedTerm final : public Leadership {
  public:
    ElectedTerm(Elected & e, EtcdLeader me, std::string election)
        : e_(e), me_(std::move(me)), election_(std::move(election)) {}
    const EtcdLeader & me() const override { return me_; }
    int64_t lease() const override { return e_.lease(); }
    void beat() override { e_.beat(); }
    bool still_leader() override { return e_.still_leader(me_, election_); }
    bool claim_store(store::Store & st) override { return e_.claim_store(st, election_, me_); }
    bool wait_stop(int ms) override { return e_.wait_signal(ms); }

  private:
    Elected & e_;
    EtcdLeader me_;
    std::string election_;
};

//! What both brains share besides the election.
//! Steady-clock milliseconds (the brains' decision time).
int64_t brain_now_ms();
//! The session states that end a session: the rest are open.
extern const std::vector<std::string> kEndedStates;
//! Commits each batch on its own (each keeps its own epoch check) but hands them to the store
//! together, so it groups them into one transaction; returns each one's status, in order.
std::vector<store::Status> commit_each(store::Store & st, std::vector<store::Batch> batches);
//! etcd's size and alarms as gauges (`armada_etcd_*`), read now; false when etcd did not answer.
bool etcd_metrics(obs::Registry & m, KvStore & etcd);
//! A leader's mark on every shard of `st` (a probe batch fenced by `election` at `rev`): from then
//! on the store refuses the writes of any leader of `election` below `rev`.
store::Status mark_leader(store::Store & st, const std::string & election, int64_t rev);
//! Whether a write was refused because a newer leader wrote (the brain should stop leading).
bool newer_leader_wrote(const store::Status & s);
//! How long a leader's loop may go without a beat before its keep-alive gives the lead up.
int stall_limit_ms(int ttl_s);
//! A brain's PostgreSQL limits, from its lease TTL: a statement the server cannot finish, or a
//! server that does not answer at all, fails the call well inside the stall limit, so a
//! PostgreSQL that hangs leaves the leader leading (its loop goes on, failing and retrying)
//! instead of handing the lead from brain to brain.
void brain_store_limits(int ttl_s, int & statement_timeout_ms, int & client_grace_ms);

}  // namespace armada::cluster

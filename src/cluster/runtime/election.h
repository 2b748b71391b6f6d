#pragma once

// etcd's election kept over plain keys, the way etcd's own election service keeps it, so that
// either can read the other's: a candidate puts `<election>/<its lease in hex>` under its lease,
// and the candidate whose key is oldest (the lowest creation revision) leads. That revision is
// the leader's fencing epoch: it only grows from one leader to the next. `Elected` campaigns
// through it against etcd, and the simulator's brains against the in-memory store.

#include "cluster/etcd.h"
#include "cluster/runtime/kv.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace armada::cluster {

//! The key a candidate of `election` stands under while it holds `lease`.
std::string election_key(const std::string & election, int64_t lease);

//! The leader among the candidates' keys (listed under `election + "/"`): the oldest.
std::optional<EtcdLeader> oldest_candidate(const std::string & election, const std::vector<EtcdKv> & candidates);

//! Stands in `election` as `value` under `lease`: puts the candidate's key (again, when it is
//! there already: its creation revision stays) and reads it back into `me`.
std::string stand(KvStore & kv, const std::string & election, const std::string & value, int64_t lease,
                  EtcdLeader & me);

//! Who leads `election` now ("no leader" when nobody stands).
std::string election_leader(KvStore & kv, const std::string & election, EtcdLeader & out);

//! Withdraws `me`'s candidacy: its key goes, and the next oldest leads.
std::string resign(KvStore & kv, const EtcdLeader & me);

//! The candidates of one election as they change: listed once, then followed by a watch. The
//! leader is read from what it holds, without a call.
class ElectionView {
  public:
    ElectionView(KvStore & kv, std::string election) : kv_(kv), election_(std::move(election)) {}
    //! Lists (the first time, and after the watch ended), then waits up to `wait_ms` for
    //! changes. False with `error` when etcd cannot be read: the view is then unknown.
    bool refresh(int wait_ms, std::string & error);
    //! The leader, as of the last refresh.
    std::optional<EtcdLeader> leader() const { return up_ ? oldest_ : std::nullopt; }
    //! Whether `key` stands, as of the last refresh (false while the view is unknown).
    bool holds(const std::string & key) const { return up_ && keys_.count(key) > 0; }
    bool up() const { return up_; }

  private:
    KvStore & kv_;
    std::string election_;
    std::unique_ptr<KvWatch> watch_;
    std::map<std::string, EtcdKv> keys_;
    std::optional<EtcdLeader> oldest_;
    bool up_ = false;
};

//! What a leader's keep-alive does at `now_ms`, given when its lease was last renewed (the time
//! the renewal was sent: etcd keeps the lease at least a TTL from then), when the leader's loop
//! last beat, and whether it leads: renew the lease every third of its TTL (at least every 300
//! ms apart); give it up once a leading loop has gone quiet for the stall limit, so that a
//! standby leads within one TTL of the last beat; and count it lost once a whole TTL has passed
//! without a renewal (etcd may have ended it: whoever holds it must stop leading). Pure:
//! `Elected`'s keep-alive thread and the simulator's brains both ask it.
enum class LeaseStep { Wait, Renew, GiveUp, Lost };
LeaseStep lease_step(int64_t now_ms, int64_t renewed_ms, int64_t beat_ms, bool leading, int64_t ttl_ms);
//! How often a lease of `ttl_ms` is renewed.
int64_t renew_every_ms(int64_t ttl_ms);
//! How long a leading loop may go without a beat before its lease is given up.
int64_t stall_limit_of(int64_t ttl_ms);

}  // namespace armada::cluster

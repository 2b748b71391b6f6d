#pragma once

// The key-value store the cluster's runners talk to: etcd in the processes, an in-memory store
// with etcd's revisions, leases and watches in unit tests and the simulator.

#include "cluster/etcd.h"
#include "cluster/runtime/clock.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace armada::cluster {

//! The changes under a prefix from a revision on.
class KvWatch {
  public:
    virtual ~KvWatch() = default;
    //! Appends the changes since the last take, waiting up to `wait_ms` for the first. False with
    //! `error` once the watch has ended (etcd went away, or compacted past it): list again and
    //! watch from there.
    virtual bool take(std::vector<EtcdEvent> & out, int wait_ms, std::string & error) = 0;
};

class KvStore {
  public:
    virtual ~KvStore() = default;
    // Each returns an error message, "" on success (as EtcdClient does).
    virtual std::string get(const std::string & key, std::optional<EtcdKv> & out) = 0;
    virtual std::string list(const std::string & prefix, std::vector<EtcdKv> & out, int64_t & revision) = 0;
    virtual std::string put(const std::string & key, const std::string & value, int64_t lease = 0) = 0;
    virtual std::string erase(const std::string & key) = 0;
    //! Deletes `key` only while its create revision is `create_revision`; `erased` says if it did.
    virtual std::string erase_if_created(const std::string & key, int64_t create_revision, bool & erased) = 0;
    virtual std::string txn(const std::vector<EtcdCompare> & compares,
                            const std::vector<std::pair<std::string, std::string>> & puts, bool & succeeded,
                            int64_t & revision) = 0;
    //! Changes under `prefix` from `from_revision` on (0: from now).
    virtual std::unique_ptr<KvWatch> watch(const std::string & prefix, int64_t from_revision) = 0;
    //! Its size, revision and alarms (what its quota counts).
    virtual std::string status(EtcdStatus & out, bool & alarms_known) = 0;

    // Leases: keys put under one go when it ends, by its TTL or revoked.
    //! A lease that ends `ttl_ms` after its last renewal (etcd counts whole seconds: rounded up).
    virtual std::string lease_grant(int64_t ttl_ms, int64_t & lease) = 0;
    //! Renews `lease`; `alive` false when it had already ended (take a new one).
    virtual std::string lease_keepalive(int64_t lease, bool & alive) = 0;
    virtual std::string lease_revoke(int64_t lease) = 0;
};

//! etcd through its JSON gateway. A watch streams on a thread of its own. A renewal of a lease it
//! granted waits on each endpoint at most two thirds of that lease's TTL shared by the endpoints
//! (never more than the client's own timeout): one endpoint that hangs must not keep a lease
//! from being renewed through the next before it ends.
class EtcdKvStore final : public KvStore {
  public:
    explicit EtcdKvStore(EtcdClient etcd) : etcd_(std::move(etcd)) {}
    std::string get(const std::string & key, std::optional<EtcdKv> & out) override { return etcd_.get(key, out); }
    std::string list(const std::string & prefix, std::vector<EtcdKv> & out, int64_t & revision) override {
        return etcd_.list(prefix, out, revision);
    }
    std::string put(const std::string & key, const std::string & value, int64_t lease) override {
        return etcd_.put(key, value, lease);
    }
    std::string erase(const std::string & key) override { return etcd_.erase(key); }
    std::string erase_if_created(const std::string & key, int64_t create_revision, bool & erased) override {
        return etcd_.erase_if_created(key, create_revision, erased);
    }
    std::string txn(const std::vector<EtcdCompare> & compares,
                    const std::vector<std::pair<std::string, std::string>> & puts, bool & succeeded,
                    int64_t & revision) override {
        return etcd_.txn(compares, puts, succeeded, revision);
    }
    std::unique_ptr<KvWatch> watch(const std::string & prefix, int64_t from_revision) override;
    std::string status(EtcdStatus & out, bool & alarms_known) override { return etcd_.status(out, alarms_known); }
    std::string lease_grant(int64_t ttl_ms, int64_t & lease) override;
    std::string lease_keepalive(int64_t lease, bool & alive) override;
    std::string lease_revoke(int64_t lease) override;
    EtcdClient & client() { return etcd_; }
    //! How long a renewal of `lease` waits on each endpoint.
    int keepalive_timeout_ms(int64_t lease) const;

  private:
    EtcdClient etcd_;
    mutable std::mutex ttl_mu_;
    std::map<int64_t, int64_t> ttl_ms_;  // leases granted here, and their TTLs (ttl_mu_)
};

//! etcd's data model in memory: one revision counter, create and mod revisions, leases whose
//! keys go when they expire or are revoked, watches, and compaction. For unit tests and the
//! simulator; thread-safe. Faults: `set_down` fails every call (and ends every watch) as a dead
//! or unreachable etcd does; `compact` ends watches from before it; `restore` puts the store
//! back to a copy taken earlier, revision included (a restore from a snapshot).
class MemoryKv final : public KvStore {
  public:
    //! With a clock, leases granted with a TTL expire by it (`expire_leases`).
    explicit MemoryKv(Clock * clock = nullptr) : clock_(clock) {}
    std::string get(const std::string & key, std::optional<EtcdKv> & out) override;
    std::string list(const std::string & prefix, std::vector<EtcdKv> & out, int64_t & revision) override;
    std::string put(const std::string & key, const std::string & value, int64_t lease) override;
    std::string erase(const std::string & key) override;
    std::string erase_if_created(const std::string & key, int64_t create_revision, bool & erased) override;
    std::string txn(const std::vector<EtcdCompare> & compares,
                    const std::vector<std::pair<std::string, std::string>> & puts, bool & succeeded,
                    int64_t & revision) override;
    std::unique_ptr<KvWatch> watch(const std::string & prefix, int64_t from_revision) override;
    //! Its size as etcd's backend would count it: every key and value now, and every change kept
    //! for watches since the last compaction (history is what compaction frees).
    std::string status(EtcdStatus & out, bool & alarms_known) override;
    std::string lease_grant(int64_t ttl_ms, int64_t & lease) override;
    std::string lease_keepalive(int64_t lease, bool & alive) override;
    std::string lease_revoke(int64_t lease) override;

    //! A lease (its id) that ends `ttl_ms` after its last keep-alive (0: only when revoked);
    //! `revoke` deletes its keys at once.
    int64_t grant(int64_t ttl_ms = 0);
    //! 1: renewed; 0: the lease is gone (take a new one); -1: etcd cannot be reached.
    int keepalive(int64_t lease);
    void revoke(int64_t lease);
    //! Revokes the leases whose TTL ran out (etcd does this by itself; the clock's owner calls it).
    void expire_leases();
    void set_down(bool down);
    void compact();
    //! etcd's periodic auto-compaction (`--auto-compaction-retention`): every `ms`, the history
    //! before the revision of `ms` ago goes (run by `expire_leases`; needs a clock). Without it,
    //! the latest 100,000 changes are kept.
    void set_retention(int64_t ms);
    struct LeaseState {
        int64_t ttl_ms = 0, deadline = 0;  // deadline 0: none
    };
    struct Snapshot {
        std::map<std::string, EtcdKv> keys;
        std::map<int64_t, LeaseState> leases;
        int64_t revision = 0;
    };
    Snapshot snapshot() const;
    void restore(const Snapshot & s);
    int64_t revision() const;
    //! Calls answered since the start (reads and writes), and keys returned by lists.
    int64_t calls() const;
    int64_t keys_listed() const;
    //! Writes applied (each one a new revision).
    int64_t writes() const;

  private:
    struct Watcher;
    //! A change made now: its revision is given by the caller (under mu_).
    void emit(const EtcdEvent & ev);
    static EtcdEvent deleted(const std::string & key, int64_t revision);
    std::string put_locked(const std::string & key, const std::string & value, int64_t lease);

    mutable std::mutex mu_;
    std::map<std::string, EtcdKv> keys_;
    int64_t revision_ = 1, next_lease_ = 1000, compacted_ = 0;
    int64_t retention_ms_ = 0, retention_mark_ = 0, retention_at_ = 0;  // the revision at the last mark, when
    Clock * clock_ = nullptr;
    std::map<int64_t, LeaseState> leases_;  // live leases
    bool down_ = false;
    mutable int64_t calls_ = 0, keys_listed_ = 0;
    int64_t writes_ = 0;
    int64_t db_high_ = 0;
    std::vector<std::weak_ptr<Watcher>> watchers_;
    //! Every change kept since the last compaction: a watch from an older revision replays them.
    std::deque<std::pair<int64_t, EtcdEvent>> history_;
};

}  // namespace armada::cluster

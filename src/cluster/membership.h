#pragma once

#include "cluster/cell_brain.h"
#include "cluster/etcd.h"
#include "cluster/global_brain.h"
#include "cluster/runtime/kv.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace armada::cluster {

//! A node's load as JSON (the value of its key in etcd) and back. Brains read thousands a
//! second: text in the exact form `encode_load` writes is read in one pass without a document
//! (`decode_load_canonical`); anything else goes through the JSON parser (`decode_load_json`),
//! and both give the same load for any text the first one takes.
std::string encode_load(const NodeLoad & l);
std::optional<NodeLoad> decode_load(const std::string & node, const std::string & json_text);
//! Only text in `encode_load`'s own form (its keys in its order, no escapes, no bytes above
//! ASCII, integers in range); nullopt for anything else, which may still be a valid report.
std::optional<NodeLoad> decode_load_canonical(const std::string & node, const std::string & text);
std::optional<NodeLoad> decode_load_json(const std::string & node, const std::string & json_text);
//! A cell's aggregate (its leading brain's key in etcd) as JSON and back.
std::string encode_cell_report(const CellReport & r);
std::optional<CellReport> decode_cell_report(const std::string & cell, const std::string & json_text);
//! The global brain's split of new sessions (its key in etcd, read by gateways) as JSON and back.
std::string encode_shares(const Shares & s);
std::optional<Shares> decode_shares(const std::string & json_text);

//! Until when (steady clock, ms) a node's lease surely lives: the send time of the last grant
//! or renewal etcd confirmed, plus the TTL it gave. 0: no lease.
using LeaseClock = std::shared_ptr<std::atomic<int64_t>>;
//! True while less than its TTL has passed since such a confirmed grant or renewal was sent.
//! False after the process was stopped or starved for longer than the TTL, until it renews or
//! joins again: its cell may have given its sessions to other nodes meanwhile.
bool lease_current(const std::atomic<int64_t> & until_ms);

//! A node's membership of its cell: it holds a lease in etcd and keeps its key (its load, about
//! once a second) under it. When the process dies or hangs, the lease expires, the key goes,
//! and the cell brain's watch sees it. When the node finds its lease gone (it was stopped for
//! longer than the TTL), it registers again with a new lease, after a random pause so that
//! nodes coming back together do not arrive together. Runs on a thread of its own.
//! The URL of `node` if it is a member of `cell` now: its key is in etcd under a lease that etcd
//! says is live. "" with `why` otherwise (no key, a key without a lease, an expired lease, no
//! URL). A node fetches a moved session's KV only from such a member, so a key someone wrote by
//! hand (or a node that is gone) never receives the node's API key.
std::string member_url(EtcdClient & etcd, const std::string & node_key, const std::string & node, std::string & why);

//! A node's membership of its cell: its key under a lease, with its load in it. The lease is
//! renewed on a thread of its own, every third of the TTL (at most every report), so a report
//! that is slow to build or to write (etcd just restarted, a token being renewed) never delays a
//! renewal past the TTL.
class NodeMembership {
  public:
    NodeMembership(std::shared_ptr<KvStore> kv, std::string key, int ttl_s, int report_ms,
                   std::function<NodeLoad()> load);
    NodeMembership(EtcdClient etcd, std::string key, int ttl_s, int report_ms, std::function<NodeLoad()> load);
    ~NodeMembership();
    void start();
    //! Leaves: revokes the lease, so the brain knows at once (not after the TTL).
    void stop();
    //! The lease held now (0: none).
    int64_t lease() const { return lease_.load(); }
    //! How many times it registered (1 after the first; more after losing its lease).
    int registrations() const { return registrations_.load(); }
    //! Whether the lease is surely still alive by this process's own clock (`lease_current`).
    bool current() const { return lease_current(*current_until_ms_); }
    //! Where it keeps until when its lease surely lives, for others to check; replace before
    //! `start`.
    void share_clock(LeaseClock c) { current_until_ms_ = std::move(c); }

  private:
    void run();    // registers, and reports the load
    void renew();  // keeps the lease
    //! False when stopping; `until_lost`: also ends when the lease is found gone.
    bool pause(int ms, bool until_lost = false);
    int renew_period_ms() const;

    std::shared_ptr<KvStore> kv_;
    std::string key_;
    int ttl_s_, report_ms_;
    std::function<NodeLoad()> load_;
    //! The last report's number; starts at random, so a restarted node's reports are new.
    int64_t seq_ = 0;
    //! The node's load, numbered.
    NodeLoad numbered();
    std::atomic<int64_t> lease_{0};
    //! Until when (steady clock, ms) the lease surely lives: the send time of the last confirmed
    //! grant or renewal, plus the TTL etcd gave.
    LeaseClock current_until_ms_ = std::make_shared<std::atomic<int64_t>>(0);
    std::atomic<int> registrations_{0};
    std::atomic<int64_t> renew_late_{0}, renew_failed_{0}, lease_lost_{0};  // in each report's signals
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::thread thread_, renew_thread_;
};

}  // namespace armada::cluster

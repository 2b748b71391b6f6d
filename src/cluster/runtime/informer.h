#pragma once

// An informer: the keys under a prefix, kept current by a list and then a watch from the
// revision after it. When the watch ends (etcd restarted, compacted past it, restored, or the
// connection died without a word), it lists again after a jittered back-off and hands out the
// difference, so a consumer sees one stream of puts and deletes whatever happened in between.

#include "cluster/runtime/clock.h"
#include "cluster/runtime/kv.h"
#include "common/backoff.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace armada::cluster {

class Informer {
  public:
    //! `relist_every_ms` > 0: a fresh list that often even while the watch seems well (a stream
    //! over a connection that died silently would otherwise keep an old view).
    Informer(KvStore & kv, std::string prefix, Clock & clock, int64_t relist_every_ms = 0,
             common::Backoff backoff = common::Backoff());
    Informer(const Informer &) = delete;
    Informer & operator=(const Informer &) = delete;

    //! Brings the view up to date and appends what changed since the last call. Waits up to
    //! `wait_ms` for a change while the watch is up; never waits out a back-off (it returns false
    //! then, with `retry_in_ms` saying when to come back). False with `error` when the view could
    //! not be read now: the last view stays.
    bool poll(std::vector<EtcdEvent> & changes, int wait_ms, std::string & error);
    //! The keys as last seen.
    const std::map<std::string, EtcdKv> & view() const { return view_; }
    //! Whether a list has succeeded yet.
    bool synced() const { return synced_; }
    //! The revision the view is at.
    int64_t revision() const { return revision_; }
    //! Asks for a fresh list at the next poll.
    void relist() { watch_.reset(); }
    //! Milliseconds until the next try after a failure (0: now).
    int64_t retry_in_ms() const;
    //! How many lists it has made (the first included).
    int64_t lists() const { return lists_; }
    //! Whether its last list failed (etcd could not be read), as opposed to a watch that ended.
    bool list_failed() const { return list_failed_; }
    const std::string & prefix() const { return prefix_; }

  private:
    bool list(std::vector<EtcdEvent> & changes, std::string & error);
    void failed();

    KvStore & kv_;
    std::string prefix_;
    Clock & clock_;
    int64_t relist_every_ms_;
    common::Backoff backoff_;
    std::unique_ptr<KvWatch> watch_;
    std::map<std::string, EtcdKv> view_;
    bool synced_ = false, list_failed_ = false;
    int64_t revision_ = 0, listed_at_ = 0, retry_at_ = 0, lists_ = 0;
};

}  // namespace armada::cluster

#pragma once

#include "cluster/etcd.h"
#include "store/store.h"

#include <atomic>
#include <csignal>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace armada::cli {

//! A process that takes turns to lead through etcd's election (a cell brain, the global brain).
//! It holds a lease, kept alive on a thread of its own, and campaigns with a short deadline again
//! and again. The server-side campaign neither keeps the lease alive nor stops when it expires,
//! so after winning it checks with `leader` that its key is the leader's; `lead` then runs, and
//! should call `still_leader` about once a second and return when it is false or on a stop.
class Elected {
  public:
    //! `what` names the role in logs ("cell cell0", "global").
    Elected(cluster::EtcdClient & etcd, int ttl_s, std::string what, sigset_t stop_set);
    ~Elected();
    Elected(const Elected &) = delete;
    Elected & operator=(const Elected &) = delete;

    //! Campaigns in `election` as `name` until a stop signal; runs `lead` while it leads. On the
    //! way out the lease is revoked, so a standby leads at once.
    void run(const std::string & election, const std::string & name,
             const std::function<void(const cluster::EtcdLeader &)> & lead);
    bool stopping() const { return quit_.load(); }
    //! Waits up to `ms` for a stop signal; true when one came.
    bool wait_signal(int ms);
    bool still_leader(const cluster::EtcdLeader & me, const std::string & election);
    //! The lease held now (0 while there is none): keys put under it go when this process does.
    int64_t lease() const { return lease_.load(); }

  private:
    void keep_lease();

    cluster::EtcdClient & etcd_;
    int ttl_s_;
    std::string what_;
    sigset_t stop_set_;
    std::atomic<int64_t> lease_{0};
    std::atomic<bool> quit_{false};
    std::thread keepalive_;
};

//! What both brains share besides the election.
//! Steady-clock milliseconds (the brains' decision time).
int64_t brain_now_ms();
//! The session states that end a session: the rest are open.
extern const std::vector<std::string> kEndedStates;
//! Commits each batch on its own (each keeps its own epoch check) but hands them to the store
//! together, so it groups them into one transaction; returns each one's status, in order.
std::vector<store::Status> commit_each(store::Store & st, std::vector<store::Batch> batches);

}  // namespace armada::cli

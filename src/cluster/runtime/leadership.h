#pragma once

#include "cluster/etcd.h"
#include "store/store.h"

#include <cstdint>

namespace armada::cluster {

//! What a runner needs from its election while it leads: the term it leads under, a heartbeat
//! (a loop that stops beating loses the lead), the check that it still leads, its mark on the
//! store, and stop signals. `Elected` gives one per term; tests and the simulator their own.
class Leadership {
  public:
    virtual ~Leadership() = default;
    //! The leader's key and fencing epoch (`rev`) for this term.
    virtual const EtcdLeader & me() const = 0;
    //! The lease keys written for this term go under (0: none now).
    virtual int64_t lease() const = 0;
    virtual void beat() = 0;
    virtual bool still_leader() = 0;
    //! The term's mark on every shard of the store; false when it cannot lead after all.
    virtual bool claim_store(store::Store & st) = 0;
    //! Waits up to `ms` (0: only looks); true once a stop came.
    virtual bool wait_stop(int ms) = 0;
};

}  // namespace armada::cluster

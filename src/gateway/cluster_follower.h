#pragma once

// What a gateway routes on, followed in etcd: the cells (each node's load and URL, each cell's
// report), the live gateways (each one's share of a quota), the global brain's split of new
// sessions, and a rollout's state (for the dashboard). One informer per prefix, so the global
// election, failovers and rollout requests never reach a gateway (a cell's election keys share
// the cells' prefix and are dropped unread); each change is decoded here, on the follower's
// thread, so the routing lock is held only to store what was decoded.

#include "cluster/global_brain.h"
#include "cluster/rollout.h"
#include "cluster/runtime/clock.h"
#include "cluster/runtime/informer.h"
#include "cluster/runtime/keys.h"
#include "cluster/runtime/kv.h"
#include "gateway/routing.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace armada::gateway {

class ClusterFollower {
  public:
    using Reports = std::map<std::string, cluster::CellReport>;
    //! Everything followed, as the informers have it now.
    struct View {
        NodeViews nodes;  // nodes with a URL
        Reports reports;
        std::optional<cluster::Shares> shares;
        std::optional<cluster::RolloutState> rollout;
        std::set<std::string> gateways;  // their keys
    };
    //! One key changed, decoded.
    struct Change {
        cluster::ClusterKeys::Parsed key;
        bool put = false;
        std::optional<NodeView> node;  // a put of a node with a URL
        std::optional<cluster::CellReport> report;
        std::optional<cluster::Shares> shares;
        std::optional<cluster::RolloutState> rollout;
        std::string raw;  // the key
    };
    struct Round {
        bool ok = true;               // every informer could be read
        bool list_failed = false;     // one could not list (etcd unreachable), not only a watch that ended
        std::string error;            // the first that could not, and why
        bool rebuilt = false;         // an informer listed afresh: `view` replaces what was known
        View view;                    // when rebuilt
        std::vector<Change> changes;  // otherwise
        int64_t retry_in_ms = 0;      // how long to pause before the next round (the cells could not be read)
    };

    ClusterFollower(cluster::KvStore & kv, const std::string & prefix, cluster::Clock & clock,
                    int64_t relist_ms = 30000);
    //! One round: waits up to `wait_ms` for a change to the cells (the rest are looked at).
    Round poll(int wait_ms);
    //! The prefixes it watches.
    std::vector<std::string> prefixes() const;

  private:
    View full() const;
    Change decode(const cluster::EtcdEvent & ev) const;

    cluster::ClusterKeys keys_;
    struct Followed {
        std::unique_ptr<cluster::Informer> inf;
        int64_t lists_seen = 0;
    };
    std::vector<Followed> followed_;  // cells first
};

}  // namespace armada::gateway

#pragma once

// The cluster as one gateway sees it, followed in etcd (gateway/cluster_follower.h): each node's
// URL and load, the cells' reports, the global brain's split of new sessions, the live gateways
// and a rollout's state. Everything a routing decision reads comes from here, under one lock held
// only to copy or store; what changed is decoded on the follower's thread.
//
// Owns: the routing view and the choices made on it alone (a node by load, a session's holder,
// the cell of a new session, a chat turn's node). It may include cluster/ and store/ records,
// never the relay, the store's implementations or the API's routes.

#include "cluster/runtime/kv.h"
#include "gateway/cluster_follower.h"
#include "gateway/dashboard.h"
#include "gateway/routing.h"
#include "store/store.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace armada::gateway {

class ClusterView {
  public:
    //! Follows `prefix` in `kv`, listing it afresh every `relist_ms` in any case.
    ClusterView(cluster::KvStore & kv, const std::string & prefix, int64_t relist_ms);

    //! One round of the follower: -1 when the next may start now, else how long to pause first
    //! (the cells could not be read).
    int64_t follow_round(int wait_ms);
    //! Rounds until `stop`: a list, then watches; a broken watch is listed again after a jittered
    //! back-off.
    void follow(const std::atomic<bool> & stop);

    //! A node etcd holds a key for (one a connect failed to included).
    std::optional<NodeView> node(const std::string & name);
    //! The live, non-draining node with the most room (round-robin among equals), or none.
    std::optional<std::string> by_load(const std::string & cell = {}, const std::set<std::string> & avoid = {});
    //! A connect to `name` failed: no new work goes to it until etcd speaks of it again. It still
    //! holds its sessions (`holder`) while its key lives: only etcd says a node is gone.
    void forget(const std::string & name);
    //! The node that holds session `rec` now, while etcd holds its key (a node a connect failed to
    //! included): a request for the session goes there or nowhere, never to a node by load.
    std::optional<std::string> holder(const store::SessionRecord & rec);
    //! The cell for a new session of `tenant`: the global brain's split (the tenant's home cell
    //! first) over the cells with a live node, else the cell under its water level whose nodes
    //! report the most room. "" when every cell that takes work is at its water level (the split
    //! marks it full): the room above the water is the reserve that takes in a lost cell's
    //! sessions, so new ones wait rather than eat it.
    std::string pick_cell(const std::string & tenant);
    //! Where a chat turn bound to `bound` goes (routing.h, chat_route).
    std::optional<std::string> chat_route(const std::optional<std::string> & bound);
    //! Tokens one sequence of the CPU nodes holds (the largest any live node reports; 0: none says).
    int64_t cpu_context();
    //! KV bytes `tenant`'s sessions hold on the nodes, by their reports.
    int64_t kv_held(const std::string & tenant);

    struct Readiness {
        size_t nodes = 0;
        std::map<std::string, double> weights;  // the split followed (tenant homes stay private)
        std::set<std::string> full;
    };
    Readiness readiness();
    size_t node_count();
    //! The live gateways (this one included), at least 1: each one's share of a quota without Redis.
    int live_gateways() const { return live_gateways_.load(); }
    //! False while etcd cannot be read (the view is the last one it gave).
    bool etcd_ok() const { return !etcd_warned_.load(); }
    //! The view for the dashboard (its nodes, reports, split and rollout).
    void fill(DashboardView & v);

  private:
    using Reports = std::map<std::string, cluster::CellReport>;
    ClusterFollower follower_;
    std::set<std::string> gateways_;  // the follower thread's
    std::atomic<int> live_gateways_{1};
    std::atomic<bool> etcd_warned_{false};
    std::mutex mu_;
    NodeViews nodes_;                               // mu_
    NodeViews unreachable_;                         // nodes a connect failed to, until etcd speaks of them (mu_)
    Reports reports_;                               // the cells' aggregates; mu_
    std::optional<cluster::RolloutState> rollout_;  // the rollout's state in etcd; mu_
    cluster::Shares shares_;                        // mu_
    uint64_t rr_ = 0;                               // mu_
};

}  // namespace armada::gateway

#pragma once

#include "agent/session_manager.h"
#include "cluster/cluster_config.h"
#include "cluster/membership.h"
#include "cluster/queue.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace armada::cli {

//! Node → brain events (armada.event.<cell>) waiting to be published: a session that ended here,
//! the node starting to drain. Filled from any thread without blocking (the session manager calls
//! `push` under its lock); ClusterNode's publisher thread sends them. Bounded: they are hints that
//! make the brain act sooner, and its reconcile finds the same facts in the store and etcd.
class NodeEvents {
  public:
    explicit NodeEvents(std::string node) : node_(std::move(node)) {}
    //! {"op":"ended","session","node","state"}, deduplicated by session in the stream.
    void ended(const std::string & session, const std::string & state);
    //! {"op":"draining","node"}.
    void draining();
    //! {"op":"movable","session","node","epoch"[,"traceparent"][,"kv_bytes"]}: draining or past
    //! its KV watermark, the node has the session between steps, so the brain may move it with its
    //! KV (its `migrate` span goes in the session's trace), whose journal is at most kv_bytes.
    //! Repeated every few seconds while it stays.
    void movable(const std::string & session, int64_t epoch, const std::string & traceparent, uint64_t kv_bytes,
                 int64_t now_ms);
    //! The next event, waiting up to `wait_ms`; false when none came.
    bool pop(std::pair<std::string, std::string> & out, int wait_ms);
    uint64_t dropped() const { return dropped_.load(); }

  private:
    void push(std::string data, std::string msg_id);
    static constexpr size_t kMax = 10000;
    std::string node_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::pair<std::string, std::string>> q_;  // (data, msg id)
    std::atomic<uint64_t> dropped_{0};
};

//! A node's part in its cell (`armada serve --cluster FILE --cell C`): it holds a lease in etcd
//! with its load report, and runs the sessions the cell brain sends it (`run` commands on
//! armada.cmd.<node>). The sessions' writes are fenced by the SessionManager (cluster mode).
class ClusterNode {
  public:
    //! Fetches a moving session's KV from the node that had it (`from`, answering at `url`; ""
    //! when it is gone) and installs it here; never more than `stated` bytes (the move command's
    //! kv_bytes, 0: not stated).
    using FetchKv = std::function<agent::MoveNote(const std::string & session, const std::string & from,
                                                  const std::string & url, uint64_t stated)>;
    ClusterNode(const cluster::ClusterConfig & cfg, std::string cell, std::string node, agent::SessionManager & sm,
                std::function<cluster::NodeLoad()> load, std::shared_ptr<NodeEvents> events, FetchKv fetch_kv = {});
    ~ClusterNode();
    //! Connects to NATS and etcd and starts reporting and taking commands; an error if it cannot.
    std::string start();
    //! Leaves the cell: revokes the lease (the brain moves what is left at once) and stops.
    void stop();
    //! Revokes the lease at once and nothing else, for a process about to exit without stopping
    //! (a drain past its deadline): its sessions fail over now, not at the lease's TTL.
    void leave_now();
    //! Where the node's membership keeps until when its lease surely lives (set before `start`).
    void share_lease_clock(cluster::LeaseClock c) { lease_clock_ = std::move(c); }
    uint64_t commands() const { return commands_.load(); }
    //! The node drains: from now on its sessions are offered to the brain to move (`movable`).
    void set_draining() { draining_ = true; }
    //! Whether the node's KV is past its high watermark; while it is, a few sessions a second
    //! are offered to move elsewhere with their KV (a rebalance). Set before `start`.
    void set_kv_high(std::function<bool()> f) { kv_high_ = std::move(f); }
    //! Moves of sessions to this node whose KV is still being fetched.
    int arriving() const { return arriving_.load(); }
    //! Sessions this node has offered to move (while draining or rebalancing).
    std::set<std::string> offered() const;
    //! Other nodes of the cell that take work (in etcd, not draining); nullopt when etcd cannot
    //! be read. A draining node with none has nowhere to move its sessions to.
    std::optional<size_t> peers_taking_work() const;

  private:
    struct Arrival {
        std::string session, from;
        int64_t epoch = 0;
        std::optional<obs::TraceContext> trace;
        uint64_t kv_bytes = 0;  // the most the move command lets come (0: not stated)
    };
    void run_commands();
    void publish_events();
    void offer_movable();
    void take_arrivals();

    cluster::ClusterConfig cfg_;
    std::string cell_, node_;
    agent::SessionManager & sm_;
    std::function<cluster::NodeLoad()> load_;
    std::unique_ptr<cluster::JetStream> js_;
    std::unique_ptr<cluster::Consumer> cmds_;
    std::unique_ptr<cluster::NodeMembership> membership_;
    cluster::LeaseClock lease_clock_;
    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> commands_{0};
    std::shared_ptr<NodeEvents> events_;
    FetchKv fetch_kv_;
    std::function<bool()> kv_high_;
    mutable std::mutex offered_mu_;
    std::set<std::string> offered_;  // guarded by offered_mu_
    std::atomic<bool> draining_{false};
    std::atomic<int> arriving_{0};
    std::mutex arrivals_mu_;
    std::condition_variable arrivals_cv_;
    std::deque<Arrival> arrivals_;  // guarded by arrivals_mu_
    std::thread thread_, events_thread_;
    std::vector<std::thread> fetchers_;
};

}  // namespace armada::cli

#pragma once

#include "agent/session_manager.h"
#include "cluster/cluster_config.h"
#include "cluster/membership.h"
#include "cluster/queue.h"
#include "cluster/runtime/bus.h"
#include "cluster/runtime/kv.h"
#include "cluster/runtime/node_agent.h"

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

namespace armada::cli {

using cluster::NodeEvents;

//! A node's part in its cell (`armada serve --cluster FILE --cell C`), wired: its lease in etcd
//! with its load report (NodeMembership), and the node agent (cluster/runtime) over JetStream,
//! etcd and this process's SessionManager. The sessions' writes are fenced by the SessionManager
//! (cluster mode).
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
    uint64_t commands() const { return agent_ ? agent_->commands() : 0; }
    //! The node drains: from now on its sessions are offered to the brain to move (`movable`).
    void set_draining() {
        draining_ = true;
        if (agent_) agent_->set_draining();
    }
    //! Whether the node's KV is past its high watermark; while it is, a few sessions a second
    //! are offered to move elsewhere with their KV (a rebalance). Set before `start`.
    void set_kv_high(std::function<bool()> f) { kv_high_ = std::move(f); }
    //! Moves of sessions to this node whose KV is still being fetched.
    int arriving() const { return agent_ ? agent_->arriving() : 0; }
    //! Sessions this node has offered to move (while draining or rebalancing).
    std::set<std::string> offered() const { return agent_ ? agent_->offered() : std::set<std::string>{}; }
    //! Other nodes of the cell that take work (in etcd, not draining); nullopt when etcd cannot
    //! be read. A draining node with none has nowhere to move its sessions to.
    std::optional<size_t> peers_taking_work() const;

  private:
    class Sessions;

    cluster::ClusterConfig cfg_;
    std::string cell_, node_;
    agent::SessionManager & sm_;
    std::function<cluster::NodeLoad()> load_;
    std::shared_ptr<NodeEvents> events_;
    FetchKv fetch_kv_;
    std::function<bool()> kv_high_;
    bool draining_ = false;
    cluster::LeaseClock lease_clock_;
    cluster::EtcdKvStore kv_;
    std::unique_ptr<cluster::JetStream> js_;
    std::unique_ptr<cluster::JetStreamBus> bus_;
    std::unique_ptr<cluster::ConsumerInbox> cmds_;
    std::unique_ptr<Sessions> sessions_;
    std::unique_ptr<cluster::NodeAgent> agent_;
    std::unique_ptr<cluster::NodeMembership> membership_;
    bool stopped_ = false;
};

}  // namespace armada::cli

#pragma once

#include "agent/session_manager.h"
#include "cluster/cluster_config.h"
#include "cluster/membership.h"
#include "cluster/queue.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace armada::cli {

//! A node's part in its cell (`armada serve --cluster FILE --cell C`): it holds a lease in etcd
//! with its load report, and runs the sessions the cell brain sends it (`run` commands on
//! armada.cmd.<node>). The sessions' writes are fenced by the SessionManager (cluster mode).
class ClusterNode {
  public:
    ClusterNode(const cluster::ClusterConfig & cfg, std::string cell, std::string node, agent::SessionManager & sm,
                std::function<cluster::NodeLoad()> load);
    ~ClusterNode();
    //! Connects to NATS and etcd and starts reporting and taking commands; an error if it cannot.
    std::string start();
    //! Leaves the cell: revokes the lease (the brain moves what is left at once) and stops.
    void stop();
    uint64_t commands() const { return commands_.load(); }

  private:
    void run_commands();

    cluster::ClusterConfig cfg_;
    std::string cell_, node_;
    agent::SessionManager & sm_;
    std::function<cluster::NodeLoad()> load_;
    std::unique_ptr<cluster::JetStream> js_;
    std::unique_ptr<cluster::Consumer> cmds_;
    std::unique_ptr<cluster::NodeMembership> membership_;
    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> commands_{0};
    std::thread thread_;
};

}  // namespace armada::cli

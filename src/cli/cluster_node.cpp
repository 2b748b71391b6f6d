#include "cli/cluster_node.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

namespace armada::cli {

using json = nlohmann::json;

ClusterNode::ClusterNode(const cluster::ClusterConfig & cfg, std::string cell, std::string node,
                         agent::SessionManager & sm, std::function<cluster::NodeLoad()> load)
    : cfg_(cfg), cell_(std::move(cell)), node_(std::move(node)), sm_(sm), load_(std::move(load)) {}

ClusterNode::~ClusterNode() {
    stop();
}

std::string ClusterNode::start() {
    std::string err;
    js_ = cluster::JetStream::connect(cfg_.nats, err);
    if (!js_) return "NATS at " + cfg_.nats + ": " + err;
    // One durable consumer per node on its own subject: a command sent while the node was away
    // waits for it; a command not acked in 30 s (the node hung) comes again.
    cmds_ = js_->consumer("ARMADA_CMD", "node-" + node_, cluster::command_subject(node_), 30000, 5, err);
    if (!cmds_) return "NATS consumer for " + node_ + ": " + err;
    membership_ =
        std::make_unique<cluster::NodeMembership>(cluster::EtcdClient(cfg_.etcd), cluster::node_key(cfg_, cell_, node_),
                                                  cfg_.lease_ttl_s, cfg_.report_ms, [this] {
                                                      auto l = load_();
                                                      l.node = node_;
                                                      return l;
                                                  });
    membership_->start();
    thread_ = std::thread([this] { run_commands(); });
    return {};
}

void ClusterNode::stop() {
    if (stop_.exchange(true)) return;
    if (thread_.joinable()) thread_.join();
    if (membership_) membership_->stop();
}

void ClusterNode::run_commands() {
    auto last_check = std::chrono::steady_clock::now();
    while (!stop_.load()) {
        // Level-triggered: what the store assigns to this node runs here, command or not.
        if (std::chrono::steady_clock::now() - last_check > std::chrono::seconds(5)) {
            last_check = std::chrono::steady_clock::now();
            sm_.adopt_assigned();
        }
        std::string err;
        auto msgs = cmds_->fetch(16, 500, err);
        if (!err.empty()) {
            spdlog::warn("cluster: fetching commands: {}", err);
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            continue;
        }
        for (auto & m : msgs) {
            ++commands_;
            const json j = json::parse(m.data(), nullptr, false);
            const std::string op = j.is_object() ? j.value("op", "") : "";
            if (op == "run" && j.contains("session") && j["session"].is_string() && j.contains("epoch") &&
                j["epoch"].is_number_integer()) {
                const std::string id = j["session"].get<std::string>();
                const int64_t epoch = j["epoch"].get<int64_t>();
                if (sm_.adopt(id, epoch))
                    spdlog::info("cluster: running session {} (epoch {})", id, epoch);
                else
                    spdlog::info("cluster: command for session {} at epoch {} is stale; ignored", id, epoch);
            } else {
                spdlog::warn("cluster: unknown command on {}: {}", m.subject(), m.data().substr(0, 200));
            }
            m.ack();
        }
    }
}

}  // namespace armada::cli

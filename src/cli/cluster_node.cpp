#include "cli/cluster_node.h"

#include "cluster/etcd.h"
#include "cluster/runtime/clock.h"

#include <spdlog/spdlog.h>

namespace armada::cli {

//! The SessionManager as the node agent drives it.
class ClusterNode::Sessions final : public cluster::NodeSessions {
  public:
    explicit Sessions(agent::SessionManager & sm) : sm_(sm) {}
    bool adopt(const std::string & id, int64_t epoch, const std::optional<obs::TraceContext> & trace,
               const std::optional<cluster::Arrived> & moved) override {
        return sm_.adopt(id, epoch, trace, moved);
    }
    void adopt_assigned() override { sm_.adopt_assigned(); }
    void incoming(const std::string & id, bool on) override { sm_.incoming(id, on); }
    std::vector<Movable> movable() override {
        std::vector<Movable> out;
        for (auto & m : sm_.movable())
            out.push_back({m.id, m.epoch, m.trace, m.kv_bytes});
        return out;
    }
    void offer_to_move(size_t n) override { sm_.offer_to_move(n); }
    void stay_unmoved(int64_t after_ms) override { sm_.stay_unmoved(after_ms); }

  private:
    agent::SessionManager & sm_;
};

ClusterNode::ClusterNode(const cluster::ClusterConfig & cfg, std::string cell, std::string node,
                         agent::SessionManager & sm, std::function<cluster::NodeLoad()> load,
                         std::shared_ptr<NodeEvents> events, FetchKv fetch_kv)
    : cfg_(cfg),
      cell_(std::move(cell)),
      node_(std::move(node)),
      sm_(sm),
      load_(std::move(load)),
      events_(events ? std::move(events) : std::make_shared<NodeEvents>(node_)),
      fetch_kv_(std::move(fetch_kv)),
      kv_(cluster::make_etcd(cfg_)) {}

ClusterNode::~ClusterNode() {
    stop();
}

std::string ClusterNode::start() {
    std::string err;
    js_ = cluster::JetStream::connect(cfg_.nats, err, cfg_.nats_auth);
    if (!js_) return "NATS at " + cfg_.nats + ": " + err;
    // One durable consumer per node on its own subject: a command sent while the node was away
    // waits for it; a command not acked in 30 s (the node hung) comes again.
    auto consumer = js_->consumer("ARMADA_CMD", "node-" + node_, cluster::command_subject(node_), 30000, 5, err);
    if (!consumer) return "NATS consumer for " + node_ + ": " + err;
    cmds_ = std::make_unique<cluster::ConsumerInbox>(std::move(consumer));
    bus_ = std::make_unique<cluster::JetStreamBus>(*js_);
    membership_ = std::make_unique<cluster::NodeMembership>(
        std::make_shared<cluster::EtcdKvStore>(cluster::make_etcd(cfg_)), cluster::node_key(cfg_, cell_, node_),
        cfg_.lease_ttl_s, cfg_.report_ms, [this] {
            auto l = load_();
            l.node = node_;
            return l;
        });
    if (lease_clock_) membership_->share_clock(lease_clock_);
    membership_->start();
    sessions_ = std::make_unique<Sessions>(sm_);
    cluster::NodeAgentConfig ac;
    ac.prefix = cfg_.prefix;
    ac.cell = cell_;
    ac.node = node_;
    cluster::NodeAgent::FetchKv fetch;
    if (fetch_kv_) fetch = fetch_kv_;
    // A node fetches a moved session's KV only from a live member of its cell, so a key someone
    // wrote by hand (or a node that is gone) never receives the node's API key.
    auto member = [etcd = cluster::make_etcd(cfg_), cfg = cfg_, cell = cell_](const std::string & node,
                                                                              std::string & why) mutable {
        return cluster::member_url(etcd, cluster::node_key(cfg, cell, node), node, why);
    };
    agent_ = std::make_unique<cluster::NodeAgent>(ac, kv_, *bus_, *cmds_, *sessions_, events_, cluster::real_clock(),
                                                  std::move(fetch), std::move(member));
    if (kv_high_) agent_->set_kv_high(kv_high_);
    if (draining_) agent_->set_draining();
    agent_->start();
    return {};
}

void ClusterNode::stop() {
    if (stopped_) return;
    stopped_ = true;
    if (agent_) agent_->stop();
    if (membership_) membership_->stop();
}

void ClusterNode::leave_now() {
    if (membership_) membership_->stop();
}

std::optional<size_t> ClusterNode::peers_taking_work() const {
    if (agent_) return agent_->peers_taking_work();
    return std::nullopt;
}

}  // namespace armada::cli

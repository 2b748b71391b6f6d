#include "gateway/cluster_view.h"

#include "common/clock.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace armada::gateway {

ClusterView::ClusterView(cluster::KvStore & kv, const std::string & prefix, int64_t relist_ms)
    : follower_(kv, prefix, cluster::real_clock(), relist_ms) {}

int64_t ClusterView::follow_round(int wait_ms) {
    ClusterFollower::Round r = follower_.poll(wait_ms);
    if (!r.ok && !r.list_failed) spdlog::debug("gateway: {}", r.error);  // a watch that ended: listed again
    if (r.list_failed && !etcd_warned_)
        spdlog::warn("gateway: cannot list the cluster in etcd: {} (keeping the last view)", r.error);
    if (r.list_failed || r.ok) etcd_warned_ = r.list_failed;
    if (r.rebuilt) {
        gateways_ = std::move(r.view.gateways);
        live_gateways_ = std::max(1, int(gateways_.size()));
        std::lock_guard lk(mu_);
        nodes_ = std::move(r.view.nodes);
        unreachable_.clear();
        reports_ = std::move(r.view.reports);
        rollout_ = std::move(r.view.rollout);
        if (r.view.shares) shares_ = std::move(*r.view.shares);  // kept when deleted: no brain leads now
    } else if (!r.changes.empty()) {
        using Kind = cluster::ClusterKeys::Parsed::Kind;
        for (const auto & c : r.changes) {
            if (c.key.kind != Kind::Gateway) continue;
            if (c.put)
                gateways_.insert(c.raw);
            else
                gateways_.erase(c.raw);
        }
        live_gateways_ = std::max(1, int(gateways_.size()));
        std::lock_guard lk(mu_);
        for (auto & c : r.changes) {
            switch (c.key.kind) {
                case Kind::Node:
                    if (c.node)
                        nodes_[c.key.name] = std::move(*c.node);
                    else
                        nodes_.erase(c.key.name);
                    // What became of a node a connect failed to: back, or gone.
                    unreachable_.erase(c.key.name);
                    break;
                case Kind::CellReport:
                    if (c.report)
                        reports_[c.key.cell] = std::move(*c.report);
                    else
                        reports_.erase(c.key.cell);
                    break;
                case Kind::Shares:
                    if (c.shares) shares_ = std::move(*c.shares);  // kept when deleted
                    break;
                case Kind::RolloutState:
                    rollout_ = std::move(c.rollout);  // the rollout's progress, for the dashboard
                    break;
                default:
                    break;
            }
        }
    }
    return r.retry_in_ms > 0 ? r.retry_in_ms : -1;
}

void ClusterView::follow(const std::atomic<bool> & stop) {
    while (!stop.load()) {
        const int64_t retry_ms = follow_round(200);
        if (retry_ms < 0) continue;
        // Not before the back-off, and a stop still ends the wait soon.
        const int64_t until = common::steady_ms() + std::max<int64_t>(50, retry_ms);
        while (!stop.load() && common::steady_ms() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

std::optional<NodeView> ClusterView::node(const std::string & name) {
    std::lock_guard lk(mu_);
    auto it = nodes_.find(name);
    if (it != nodes_.end()) return it->second;
    if (auto u = unreachable_.find(name); u != unreachable_.end()) return u->second;
    return std::nullopt;
}

std::optional<std::string> ClusterView::by_load(const std::string & cell, const std::set<std::string> & avoid) {
    std::lock_guard lk(mu_);
    const auto best = most_room(nodes_, cell, avoid);
    if (best.empty()) return std::nullopt;
    return best[rr_++ % best.size()];
}

void ClusterView::forget(const std::string & name) {
    std::lock_guard lk(mu_);
    if (auto it = nodes_.find(name); it != nodes_.end()) {
        unreachable_[name] = it->second;
        nodes_.erase(it);
    }
}

std::optional<std::string> ClusterView::holder(const store::SessionRecord & rec) {
    if (rec.node.empty() || rec.epoch <= 0) return std::nullopt;
    std::lock_guard lk(mu_);
    if (!nodes_.count(rec.node) && !unreachable_.count(rec.node)) return std::nullopt;
    return rec.node;
}

std::string ClusterView::pick_cell(const std::string & tenant) {
    std::lock_guard lk(mu_);
    std::map<std::string, int64_t> room;  // cells with a live node that takes work
    for (const auto & [name, v] : nodes_) {
        if (!v.load.draining) room[v.cell] += v.load.free_seqs;
    }
    // The split may be older than the last node of a cell: a cell with none takes nothing.
    cluster::Shares live = shares_;
    std::erase_if(live.weight, [&](const auto & w) { return !room.count(w.first); });
    if (std::string c = cluster::pick_cell(live, tenant); !c.empty()) return c;
    if (room.empty()) return "cell0";  // no node known yet: the session waits in cell0's queue
    std::string best;
    int64_t most = -1;
    for (const auto & [c, r] : room) {
        if (!shares_.full.count(c) && r > most) {
            best = c;
            most = r;
        }
    }
    return best;
}

std::optional<std::string> ClusterView::chat_route(const std::optional<std::string> & bound) {
    std::lock_guard lk(mu_);
    return gateway::chat_route(nodes_, bound, rr_);
}

int64_t ClusterView::cpu_context() {
    std::lock_guard lk(mu_);
    int64_t best = 0;
    for (const auto & [name, v] : nodes_) {
        if (!v.load.draining) best = std::max(best, v.load.ctx);
    }
    return best;
}

int64_t ClusterView::kv_held(const std::string & tenant) {
    int64_t held = 0;
    std::lock_guard lk(mu_);
    for (const auto & [name, v] : nodes_) {
        if (auto it = v.load.kv_by_tenant.find(tenant); it != v.load.kv_by_tenant.end()) held += it->second;
    }
    return held;
}

ClusterView::Readiness ClusterView::readiness() {
    std::lock_guard lk(mu_);
    return {nodes_.size(), shares_.weight, shares_.full};
}

size_t ClusterView::node_count() {
    std::lock_guard lk(mu_);
    return nodes_.size();
}

void ClusterView::fill(DashboardView & v) {
    v.gateways = live_gateways();
    v.etcd_ok = etcd_ok();
    std::lock_guard lk(mu_);
    v.nodes = nodes_;
    v.reports = reports_;
    v.shares = shares_;
    v.rollout = rollout_;
}

}  // namespace armada::gateway

#include "gateway/cluster_follower.h"

#include "cluster/membership.h"

#include <algorithm>

namespace armada::gateway {

using Kind = cluster::ClusterKeys::Parsed::Kind;

ClusterFollower::ClusterFollower(cluster::KvStore & kv, const std::string & prefix, cluster::Clock & clock,
                                 int64_t relist_ms)
    : keys_(prefix) {
    // A single key is followed as a prefix of itself: any key that merely starts like it parses
    // to something else and is dropped.
    for (const std::string & p : {keys_.cells(), keys_.gateways(), keys_.shares(), keys_.rollout_state()})
        followed_.push_back({std::make_unique<cluster::Informer>(kv, p, clock, relist_ms), 0});
}

std::vector<std::string> ClusterFollower::prefixes() const {
    std::vector<std::string> out;
    for (const auto & f : followed_)
        out.push_back(f.inf->prefix());
    return out;
}

ClusterFollower::Change ClusterFollower::decode(const cluster::EtcdEvent & ev) const {
    Change c;
    c.raw = ev.kv.key;
    c.key = keys_.parse(ev.kv.key);
    c.put = ev.type == cluster::EtcdEvent::Type::Put;
    if (!c.put) return c;
    switch (c.key.kind) {
        case Kind::Node:
            if (auto l = cluster::decode_load(c.key.name, ev.kv.value); l && !l->url.empty())
                c.node = NodeView{c.key.cell, *l};
            break;
        case Kind::CellReport:
            c.report = cluster::decode_cell_report(c.key.cell, ev.kv.value);
            break;
        case Kind::Shares:
            c.shares = cluster::decode_shares(ev.kv.value);
            break;
        case Kind::RolloutState:
            c.rollout = cluster::decode_rollout_state(ev.kv.value);
            break;
        default:
            break;
    }
    return c;
}

ClusterFollower::View ClusterFollower::full() const {
    View v;
    for (const auto & f : followed_) {
        for (const auto & [key, kv] : f.inf->view()) {
            Change c = decode({cluster::EtcdEvent::Type::Put, kv});
            switch (c.key.kind) {
                case Kind::Node:
                    if (c.node) v.nodes[c.key.name] = std::move(*c.node);
                    break;
                case Kind::CellReport:
                    if (c.report) v.reports[c.key.cell] = std::move(*c.report);
                    break;
                case Kind::Shares:
                    v.shares = std::move(c.shares);
                    break;
                case Kind::RolloutState:
                    v.rollout = std::move(c.rollout);
                    break;
                case Kind::Gateway:
                    v.gateways.insert(key);
                    break;
                default:
                    break;
            }
        }
    }
    return v;
}

ClusterFollower::Round ClusterFollower::poll(int wait_ms) {
    Round r;
    std::vector<cluster::EtcdEvent> events;
    for (size_t i = 0; i < followed_.size(); ++i) {
        Followed & f = followed_[i];
        std::string err;
        if (!f.inf->poll(events, i == 0 ? wait_ms : 0, err)) {
            if (r.ok) r.error = err;
            r.list_failed = r.list_failed || f.inf->list_failed();
            // Only the cells' informer waits for changes: while it cannot, the caller pauses.
            if (i == 0) r.retry_in_ms = std::max<int64_t>(50, f.inf->retry_in_ms());
            r.ok = false;
            continue;
        }
        if (f.inf->lists() != f.lists_seen) {
            f.lists_seen = f.inf->lists();
            r.rebuilt = true;
        }
    }
    if (r.rebuilt) {
        r.view = full();
        return r;
    }
    r.changes.reserve(events.size());
    for (const auto & ev : events) {
        // The cells' election keys share their prefix; they and any stray key go here.
        const Kind kind = keys_.parse(ev.kv.key).kind;
        if (kind == Kind::Node || kind == Kind::CellReport || kind == Kind::Shares || kind == Kind::RolloutState ||
            kind == Kind::Gateway)
            r.changes.push_back(decode(ev));
    }
    return r;
}

}  // namespace armada::gateway

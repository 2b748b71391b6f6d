// The simulated world (world.h): the figures of each second, and the checks at the end of a run.

#include "sim/world.h"

#include <set>

namespace armada::sim::detail {

void World::second() {
    at(now_ + 1000, kSecond);
    // Keepalives: each leased, running node renews every TTL/3.
    int64_t leased = 0, sum = 0, most = 0, running = 0;
    for (const auto & n : nodes_) {
        if (!n.up || n.hung) continue;
        leased += n.lease && !n.partitioned;
        ++running;
        sum += int64_t(n.sessions.size());
        most = std::max(most, int64_t(n.sessions.size()));
    }
    if (!etcd_down_) count(r_.etcd_writes, now_ - 1, leased * 3000 / std::max(1, s_.lease_ttl_ms));
    r_.balance.push_back(sum > 0 ? double(most) / (double(sum) / double(running)) : 1.0);

    r_.live.push_back(open_);
}

void World::finish() {
    std::vector<std::set<uint32_t>> queued(cells_.size());
    for (size_t c = 0; c < cells_.size(); ++c)
        for (const auto & [id, epoch] : cells_[c].inbox)
            queued[c].insert(id);
    for (size_t id = 0; id < sessions_.size(); ++id) {
        Session & s = sessions_[id];
        if (!s.open) continue;
        if (s.node != kNone && !s.paused) {
            stop_run(uint32_t(id));  // count its steps so far
            continue;
        }
        if (s.waiting_since < 0 || now_ - s.waiting_since <= kGraceMs) continue;
        // Waiting long in a brain's queue (or a lost cell's, for the global brain) is load: the
        // cell has no room. Known to no brain and in no queue, it is lost.
        const Cell & c = cells_[size_t(s.cell)];
        if (c.lost || queued[size_t(s.cell)].count(uint32_t(id)) || (c.brain && c.brain->node_of(sid(uint32_t(id))))) {
            ++r_.sessions_queued;
            continue;
        }
        ++r_.sessions_stranded;
        violation("session " + sid(uint32_t(id)) + " has had no node since " + std::to_string(s.waiting_since) +
                  " ms, and no brain or queue holds it");
    }
    for (const auto & f : r_.faults) {
        // (A fault that goes on hitting, as a rollout's drain timeouts do, is judged from its
        // last hit.)
        if (f.resumed < f.sessions_hit && now_ - std::max(int64_t(f.at_s * 1000), f.last_hit_ms) > kGraceMs)
            violation(f.what + ": " + std::to_string(f.sessions_hit - f.resumed) + " of " +
                      std::to_string(f.sessions_hit) + " sessions never resumed");
    }
    // The busiest second of re-placements in the minute after each fault.
    for (auto & f : r_.faults) {
        const size_t from = sec(int64_t(f.at_s * 1000));
        for (size_t i = from; i < std::min(r_.moves.size(), from + 60); ++i)
            f.peak_moves_per_s = std::max(f.peak_moves_per_s, int(r_.moves[i]));
        for (size_t i = from; i < std::min(r_.etcd_writes.size(), from + 60); ++i)
            f.peak_etcd_writes_per_s = std::max(f.peak_etcd_writes_per_s, r_.etcd_writes[i]);
        for (size_t i = from; i < std::min(r_.nats_msgs.size(), from + 60); ++i)
            f.peak_nats_msgs_per_s = std::max(f.peak_nats_msgs_per_s, r_.nats_msgs[i]);
        for (size_t i = from; i < std::min(r_.pg_commits.size(), from + 60); ++i)
            f.peak_pg_commits_per_s = std::max(f.peak_pg_commits_per_s, r_.pg_commits[i]);
    }
    rollout_finish();
    r_.trace_hash = hash_;
}

}  // namespace armada::sim::detail

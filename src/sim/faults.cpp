// The simulated world (world.h): faults (crashes, hangs, partitions, outages) and recoveries.

#include "sim/world.h"

namespace armada::sim::detail {

std::string World::fault_name(const Fault & f) const {
    const std::string cell = "cell" + std::to_string(f.cell), node = cell + "-n" + std::to_string(f.node);
    switch (f.kind) {
        case Fault::Kind::NodeCrash:
            return "node crash " + node;
        case Fault::Kind::NodeHang:
            return "node hang " + node;
        case Fault::Kind::CellLost:
            return "cell lost " + cell;
        case Fault::Kind::BrainCrash:
            return "brain crash " + cell;
        case Fault::Kind::EtcdRestart:
            return std::string("etcd restart") + (f.jitter ? "" : " (no jitter)");
        case Fault::Kind::RestartStorm:
            return std::string("restart storm") + (f.jitter ? "" : " (no jitter)");
        case Fault::Kind::Partition:
            return "partition " + node;
        case Fault::Kind::SlowDisk:
            return "slow disk " + node;
        case Fault::Kind::NatsOutage:
            return "NATS outage";
        case Fault::Kind::PgOutage:
            return "PostgreSQL outage";
        case Fault::Kind::NatsPartition:
            return "NATS cut off from " + cell;
    }
    return "fault";
}

int64_t World::release_runs(int32_t ni, int32_t fault) {
    int64_t n = 0;
    for (uint32_t id : nodes_[size_t(ni)].sessions) {
        Session & s = sessions_[id];
        if (s.node != ni) continue;
        ++n;
        stop_run(id);
        s.node = kNone;
        s.paused = false;
        s.waiting_since = now_;
        if (fault != kNone && s.fault == kNone) {
            s.fault = fault;
            hit(fault);
        }
    }
    return n;
}

void World::crash(int32_t ni, int32_t fault) {
    Node & n = nodes_[size_t(ni)];
    if (!n.up) return;
    release_runs(ni, fault);
    n.sessions.clear();
    n.held_runs.clear();
    n.up = false;
    n.hung = false;
    n.draining = false;  // a drain it was in ends with it
    at(lease_end(n), kLeaseCheck, uint32_t(ni), n.lease_gen);
}

void World::restart(int32_t ni) {
    Node & n = nodes_[size_t(ni)];
    if (n.up) return;
    n.up = true;
    n.report_seq = int64_t(rng_.range(1, 1 << 30)) << 20;  // a new process numbers afresh
    if (!n.next_version.empty()) n.version = n.next_version;
    n.next_version.clear();
    n.draining = false;
    n.sig = {};
    n.sig.started_ms = now_ + 1;          // its counters start over
    if (!n.partitioned) renew_lease(ni);  // cut off from etcd, it registers when it heals
    // It runs what is still assigned to it (its lease may not have run out meanwhile).
    for (uint32_t id : std::vector<uint32_t>(cells_[size_t(n.cell)].open)) {
        const Session & s = sessions_[id];
        if (s.row_node == ni && s.node == kNone) start_run(id, ni, s.epoch, true);
    }
    publish(ni);  // it registers with its load
}

void World::hang(int32_t ni, double for_s, int32_t fault) {
    Node & n = nodes_[size_t(ni)];
    if (!n.up || n.hung) return;
    for (uint32_t id : n.sessions) {
        Session & s = sessions_[id];
        if (s.node != ni) continue;
        stop_run(id);
        s.paused = true;
        if (s.stalled_since < 0) s.stalled_since = now_;
        if (s.fault == kNone) {
            s.fault = fault;
            hit(fault);
        }
    }
    n.hung = true;
    at(lease_end(n), kLeaseCheck, uint32_t(ni), n.lease_gen);
    at(now_ + int64_t(for_s * 1000), kWake, uint32_t(ni));
}

void World::wake(int32_t ni) {
    Node & n = nodes_[size_t(ni)];
    if (!n.hung) return;
    n.hung = false;
    if (!n.partitioned && !n.lease) renew_lease(ni);  // a cut-off one renews when it heals
    // Its sessions go on where the store still names it under the same epoch; its writes for
    // the others are refused (fenced) and it drops them.
    for (uint32_t id : std::vector<uint32_t>(n.sessions)) {
        Session & s = sessions_[id];
        if (s.node == ni && s.paused && s.open && s.row_node == ni && s.epoch == s.run_epoch) {
            start_run(id, ni, s.epoch, false);
        } else {
            ++r_.fenced_writes;
            count(r_.pg_commits, now_);
            node_remove(ni, id);
            if (s.node == ni) {
                s.node = kNone;
                s.paused = false;
                if (s.open && s.waiting_since < 0) s.waiting_since = now_;
            }
        }
    }
    auto held = std::move(n.held_runs);
    n.held_runs.clear();
    for (const auto & [id, epoch] : held)
        run_msg(id, ni, epoch);
    publish(ni);
}

void World::partition(int32_t ni, double for_s, int32_t fault) {
    Node & n = nodes_[size_t(ni)];
    if (!n.up || n.hung || n.partitioned) return;
    n.partitioned = true;
    n.heal_at = now_ + int64_t(for_s * 1000);
    n.partition_fault = fault;
    for (uint32_t id : n.sessions) {
        Session & s = sessions_[id];
        if (s.node != ni || s.paused || s.fault != kNone) continue;
        s.fault = fault;
        hit(fault);
    }
    at(lease_end(n), kLeaseCheck, uint32_t(ni), n.lease_gen);
    at(n.heal_at, kHeal, uint32_t(ni));
}

void World::heal(int32_t ni) {
    Node & n = nodes_[size_t(ni)];
    if (!n.partitioned) return;
    n.partitioned = false;
    if (n.up && !n.hung && !n.lease) renew_lease(ni);  // a hung one renews when it wakes
    // What it still runs was never interrupted (its lease outlived the partition, or the
    // brain had not moved it yet).
    for (uint32_t id : n.sessions) {
        Session & s = sessions_[id];
        if (s.node != ni || s.fault != n.partition_fault || s.fault == kNone) continue;
        ++r_.faults[size_t(s.fault)].resumed;
        s.fault = kNone;
    }
    auto held = std::move(n.held_runs);
    n.held_runs.clear();
    for (const auto & [id, epoch] : held)
        run_msg(id, ni, epoch);
    publish(ni);
}

void World::pg_outage(double for_s, int32_t fault) {
    pg_down_ = true;
    pg_up_at_ = std::max(pg_up_at_, now_ + int64_t(for_s * 1000));
    for (size_t ni = 0; ni < nodes_.size(); ++ni) {
        const Node & n = nodes_[ni];
        if (!n.up || n.hung) continue;
        for (uint32_t id : n.sessions) {
            Session & s = sessions_[id];
            if (s.node != int32_t(ni) || s.paused || !s.open) continue;
            stop_run(id);
            s.paused = true;
            if (s.stalled_since < 0) s.stalled_since = now_;
            pg_held_.push_back(id);
            if (s.fault == kNone) {
                s.fault = fault;
                hit(fault);
            }
        }
    }
    at(pg_up_at_, kPgUp);
}

void World::pg_up() {
    if (!pg_down_ || now_ < pg_up_at_) return;
    pg_down_ = false;
    auto held = std::move(pg_held_);
    pg_held_.clear();
    for (uint32_t id : held) {
        Session & s = sessions_[id];
        if (!s.open || !s.paused || s.node == kNone) continue;
        const Node & n = nodes_[size_t(s.node)];
        if (!n.up || n.hung || !node_has(s.node, id)) continue;  // its node's own recovery handles it
        if (s.row_node != s.node || s.epoch != s.run_epoch) continue;
        start_run(id, s.node, s.run_epoch, false);
    }
}

void World::slow_disk(int32_t ni, int32_t ms) {
    Node & n = nodes_[size_t(ni)];
    n.slow_ms = ms;
    if (!n.up || n.hung) return;
    for (uint32_t id : std::vector<uint32_t>(n.sessions)) {
        const Session & s = sessions_[id];
        if (s.node != ni || s.paused || !s.open) continue;
        stop_run(id);
        // The same run at a new pace: not a resume, so a fault's mark (a partition) stays.
        const int32_t fault = sessions_[id].fault;
        sessions_[id].fault = kNone;
        start_run(id, ni, sessions_[id].run_epoch, false);
        sessions_[id].fault = fault;
    }
}

void World::brain_up(uint32_t ci) {
    Cell & c = cells_[ci];
    if (c.brain || c.lost) return;
    c.brain = std::make_unique<cluster::CellBrain>();
    c.last_reconcile = -1;  // a new leader starts from the truth
}

void World::cell_back(uint32_t ci) {
    Cell & c = cells_[ci];
    c.lost = false;
    brain_up(ci);
    for (int32_t i : nodes_of(int(ci)))
        restart(i);
}

void World::etcd_up() {
    etcd_down_ = false;
    // Every client comes back: all at once, or spread over a jittered pause.
    for (size_t i = 0; i < nodes_.size(); ++i) {
        const int64_t d = etcd_jitter_ ? rng_.range(0, 2000) : 0;
        count(r_.etcd_writes, now_ + d, 2);
    }
}

void World::fault(const Fault & f, int32_t fi) {
    const int32_t ni = f.cell * s_.nodes_per_cell + f.node;
    switch (f.kind) {
        case Fault::Kind::NodeCrash:
            crash(ni, fi);
            if (f.for_s > 0) at(now_ + int64_t(f.for_s * 1000), kRestart, uint32_t(ni));
            return;
        case Fault::Kind::NodeHang:
            return hang(ni, f.for_s, fi);
        case Fault::Kind::CellLost: {
            Cell & c = cells_[size_t(f.cell)];
            c.brain.reset();
            c.lost = true;
            for (int32_t i : nodes_of(f.cell))
                crash(i, fi);
            if (f.for_s > 0) at(now_ + int64_t(f.for_s * 1000), kCellBack, uint32_t(f.cell));
            return;
        }
        case Fault::Kind::BrainCrash:
            cells_[size_t(f.cell)].brain.reset();
            // A standby campaigns and leads once the dead leader's lease runs out.
            at(now_ + s_.lease_ttl_ms + s_.watch_ms, kBrainUp, uint32_t(f.cell));
            return;
        case Fault::Kind::EtcdRestart:
            etcd_down_ = true;
            etcd_jitter_ = f.jitter;
            etcd_up_at_ = now_ + int64_t(f.for_s * 1000);
            at(etcd_up_at_, kEtcdUp);
            return;
        case Fault::Kind::Partition:
            return partition(ni, f.for_s, fi);
        case Fault::Kind::SlowDisk:
            slow_disk(ni, f.ms);
            at(now_ + int64_t(f.for_s * 1000), kDiskOk, uint32_t(ni));
            return;
        case Fault::Kind::NatsOutage:
            nats_down_ = true;
            nats_fault_ = fi;
            nats_up_at_ = std::max(nats_up_at_, now_ + int64_t(f.for_s * 1000));
            at(nats_up_at_, kNatsUp);
            return;
        case Fault::Kind::PgOutage:
            return pg_outage(f.for_s, fi);
        case Fault::Kind::NatsPartition: {
            Cell & c = cells_[size_t(f.cell)];
            c.nats_cut_until = std::max(c.nats_cut_until, now_ + int64_t(f.for_s * 1000));
            c.nats_cut_fault = fi;
            return;
        }
        case Fault::Kind::RestartStorm:
            for (size_t i = 0; i < nodes_.size(); ++i) {
                crash(int32_t(i), fi);
                // Each node's first reconnect waits a random pause of up to a second.
                const int64_t d = f.jitter ? rng_.range(0, 1000) : 0;
                at(now_ + int64_t(f.for_s * 1000) + d, kRestart, uint32_t(i));
            }
            return;
    }
}

}  // namespace armada::sim::detail

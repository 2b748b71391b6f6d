// The simulated world (world.h): the real Rollout's turns, and the drains and restarts it asks for.

#include "sim/world.h"

#include <cstdio>

namespace armada::sim::detail {

cluster::NodeSignals World::signals(int32_t ni) const {
    const Node & n = nodes_[size_t(ni)];
    cluster::NodeSignals g = n.sig;
    for (uint32_t id : n.sessions) {
        const Session & s = sessions_[id];
        if (s.node != ni || s.paused || now_ <= s.seg_start) continue;
        const int64_t k = std::min<int64_t>((now_ - s.seg_start) / s.period, s.steps - s.done);
        g.steps += k;
        g.step_s += double(k) * s.gen_ms / 1000.0;
    }
    if (bad(n)) g.errors["model"] = g.steps;
    return g;
}

void World::rollout_turn() {
    const RolloutPlan & p = s_.rollout;
    RolloutOutcome & ro = r_.rollout;
    if (!p.on || now_ < int64_t(p.at_s * 1000) || etcd_down_) return;
    if (!rollout_) {
        cluster::RolloutSpec spec;
        spec.id = "r-sim";
        spec.version = kNewVersion;
        spec.wave_percent = p.wave_percent;
        spec.max_per_cell = p.max_per_cell;
        spec.settle_ms = int64_t(p.settle_s * 1000);
        spec.before_ms = spec.settle_ms;
        spec.restarts_per_s = p.restarts_per_s;
        spec.ready_timeout_ms = int64_t((p.drain_timeout_s + p.restart_s + p.jitter_s) * 1000) + 60000;
        spec.at_ms = now_;
        rollout_ = std::make_unique<cluster::Rollout>(spec, std::nullopt, now_);
        ro.ran = true;
        ro.started_s = double(now_) / 1000.0;
        // Sessions a drain leaves behind at its timeout are checked like a fault's: each must
        // be resumed elsewhere.
        rollout_fault_ = int32_t(r_.faults.size());
        r_.faults.push_back({"rollout drain timeouts", ro.started_s});
        count(r_.etcd_writes, now_);  // the spec
    }
    if (rollout_->finished()) return;
    std::vector<cluster::FleetNode> live;
    for (size_t i = 0; i < nodes_.size(); ++i) {
        const Node & n = nodes_[i];
        if (!n.lease || !n.up || !n.reported) continue;
        live.push_back({n.name, cells_[size_t(n.cell)].name, n.version, n.draining, signals(int32_t(i))});
    }
    rollout_->fleet(live, now_);
    const auto wanted = rollout_->decide(now_);
    if (rollout_->take_changed()) count(r_.etcd_writes, now_);  // the state, fenced on the leader's key
    for (const auto & q : wanted) {
        const int32_t ni = node_index(q.node);
        Node & n = nodes_[size_t(ni)];
        if (q.gen <= n.acted_gen) continue;  // a restarter acts on a gen once
        n.acted_gen = q.gen;
        count(r_.etcd_writes, now_, 2);  // the request, and the restarter's acknowledgement
        trace(now_, 102, uint32_t(ni), 0, q.gen);
        begin_drain(ni, q.version);
    }
    if (rollout_->finished()) ro.ended_s = double(now_) / 1000.0;
}

void World::begin_drain(int32_t ni, const std::string & version) {
    Node & n = nodes_[size_t(ni)];
    n.next_version = version;
    const int64_t back = int64_t(s_.rollout.restart_s * 1000) + rng_.range(0, int64_t(s_.rollout.jitter_s * 1000));
    if (!n.up) {  // down already: it only has to start on the new version (unless its cell is lost)
        if (!cells_[size_t(n.cell)].lost) {
            ++r_.rollout.restarts;
            at(now_ + back, kRestart, uint32_t(ni));
        }
        return;
    }
    n.draining = true;
    n.drain_until = now_ + int64_t(s_.rollout.drain_timeout_s * 1000);
    ++n.drains;
    if (Cell & c = cells_[size_t(n.cell)]; c.brain) c.brain->node_draining(n.name);
    publish(ni);
    for (uint32_t id : n.sessions)
        if (sessions_[id].node == ni) offer_at_boundary(id, ni);
    at(now_ + 1000, kDrainCheck, uint32_t(ni), n.drains);
}

void World::offer_at_boundary(uint32_t id, int32_t ni) {
    const Session & s = sessions_[id];
    if (s.paused) return;
    const int64_t into = std::max<int64_t>(0, now_ - s.seg_start);
    at(now_ + (s.period - into % s.period) % s.period, kMovable, id, uint32_t(ni));
}

void World::movable(uint32_t id, int32_t ni) {
    Node & n = nodes_[size_t(ni)];
    const Session & s = sessions_[id];
    if (!n.draining || !n.up || n.hung || s.node != ni || !s.open) return;
    count(r_.nats_msgs, now_);
    if (Cell & c = cells_[size_t(n.cell)]; c.brain) c.brain->session_movable(sid(id), n.name, s.epoch);
}

void World::drain_check(int32_t ni, uint32_t drain) {
    Node & n = nodes_[size_t(ni)];
    if (!n.draining || n.drains != drain || !n.up) return;
    if (n.hung) {
        at(now_ + 1000, kDrainCheck, uint32_t(ni), drain);
        return;
    }
    size_t running = 0;
    for (uint32_t id : n.sessions)
        running += sessions_[id].node == ni;
    if (running > 0 && now_ < n.drain_until) {
        // Offers a new brain has not heard (its leader changed) are made again every few seconds.
        if ((now_ / 1000) % 5 == 0)
            for (uint32_t id : n.sessions)
                if (sessions_[id].node == ni) offer_at_boundary(id, ni);
        at(now_ + 1000, kDrainCheck, uint32_t(ni), drain);
        return;
    }
    // Empty or out of time: it exits, revoking its lease; what it still ran fails over.
    r_.rollout.failed_over += release_runs(ni, rollout_fault_);
    n.sessions.clear();
    n.held_runs.clear();
    n.up = false;
    n.draining = false;
    n.lease = false;
    ++n.lease_gen;
    count(r_.etcd_writes, now_);  // the revoke
    watch(ni, std::nullopt);
    ++r_.rollout.restarts;
    at(now_ + int64_t(s_.rollout.restart_s * 1000) + rng_.range(0, int64_t(s_.rollout.jitter_s * 1000)), kRestart,
       uint32_t(ni));
}

void World::rollout_finish() {
    RolloutOutcome & ro = r_.rollout;
    if (!rollout_) return;
    const auto & st = rollout_->state();
    ro.phase = st.phase;
    ro.fired = st.fired;
    ro.waves = st.wave;
    for (const auto & g : st.gates) {
        char b[200];
        std::snprintf(b, sizeof b, "%s%s: wave %.3g, rest %.3g, before %.3g, limit %.3g%s%s%s", g.signal.c_str(),
                      g.code.empty() ? "" : (" (" + g.code + ")").c_str(), g.upgraded, g.rest, g.before, g.limit,
                      g.fired ? ", fired" : (g.judged ? "" : ", not judged"), g.note.empty() ? "" : ": ",
                      g.note.c_str());
        ro.gates.push_back(b);
    }
    for (const auto & n : nodes_)
        ro.nodes_on_new += n.up && n.lease && n.version == kNewVersion;
    const size_t from = sec(int64_t(ro.started_s * 1000));
    const size_t to = ro.ended_s < 0 ? ~size_t(0) : sec(int64_t(ro.ended_s * 1000)) + 1;
    const auto peak = [&](const std::vector<int64_t> & v) {
        int64_t m = 0;
        for (size_t i = from; i < std::min(v.size(), to); ++i)
            m = std::max(m, v[i]);
        return m;
    };
    ro.peak_etcd_writes_per_s = peak(r_.etcd_writes);
    ro.peak_leases_per_s = peak(r_.leases);
    ro.peak_nats_msgs_per_s = peak(r_.nats_msgs);
    ro.peak_moves_per_s = peak(r_.moves);
    ro.peak_pg_commits_per_s = peak(r_.pg_commits);
}

}  // namespace armada::sim::detail

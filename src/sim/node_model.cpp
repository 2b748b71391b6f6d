// The simulated world (world.h): what a node does with a session: its KV, its step times, its runs.

#include "sim/world.h"

namespace armada::sim::detail {

double World::kv_bytes(int32_t ni) const {
    const Node & n = nodes_[size_t(ni)];
    double tokens = 0;
    for (uint32_t id : n.sessions) {
        const Session & s = sessions_[id];
        if (s.node != ni || !s.open) continue;
        int64_t done = s.done;
        if (!s.paused && now_ > s.seg_start)
            done += std::min<int64_t>((now_ - s.seg_start) / s.period, s.steps - s.done);
        tokens += s_.node.kv_base_tokens + double(done) * s_.node.kv_step_tokens;
    }
    return tokens * s_.node.kv_bytes_per_token;
}

int32_t World::gen_ms(size_t n, int32_t wait_ms) const {
    const double seq = s_.node.seq_tokens_per_s, all = s_.node.tokens_per_s, tok = s_.node.step_tokens;
    // With prefill modelled, each step also reads its new prompt tokens at the node's prefill
    // rate, shared the same way.
    const double pre = s_.node.prefill_tokens_per_s, prompt = pre > 0 ? s_.node.step_prompt_tokens : 0;
    double g = tok * 1000.0 / seq + (prompt > 0 ? prompt * 1000.0 / pre : 0);
    const auto & curve = s_.node.decode_curve;
    if (!curve.empty()) g = tok * 1000.0 / curve.front().second + (prompt > 0 ? prompt * 1000.0 / pre : 0);
    for (int i = 0; i < 4; ++i) {  // the generating share depends on the step time: a few rounds
        const double share = std::max(1.0, double(n) * g / (g + wait_ms));
        double rate = std::min(seq, all / share);
        if (!curve.empty()) rate = curve_at(share) / share;
        g = tok * 1000.0 / rate + (prompt > 0 ? prompt * 1000.0 * share / pre : 0);
    }
    return int32_t(g);
}

double World::curve_at(double batch) const {
    const auto & c = s_.node.decode_curve;
    if (batch <= c.front().first) return c.front().second;
    for (size_t i = 1; i < c.size(); ++i) {
        if (batch <= c[i].first) {
            const double f = (batch - c[i - 1].first) / (c[i].first - c[i - 1].first);
            return c[i - 1].second + f * (c[i].second - c[i - 1].second);
        }
    }
    return c.back().second;
}

void World::start_run(uint32_t id, int32_t ni, int64_t epoch, bool restore) {
    Session & s = sessions_[id];
    Node & n = nodes_[size_t(ni)];
    if (s.node != kNone && s.node != ni) {
        Node & old = nodes_[size_t(s.node)];
        if (old.up && !old.hung && node_has(s.node, id)) {
            if (s.run_epoch == epoch)
                violation("session " + sid(id) + " runs on two live nodes in epoch " + std::to_string(epoch) + ": " +
                          old.name + " and " + n.name);
            // The old runner (it woke after the move) is refused at its next write and stops.
            stop_run(id);
            node_remove(s.node, id);
            ++r_.fenced_writes;
        }
        // A hung node keeps it until it wakes and is fenced.
    }
    if (!node_has(ni, id)) {
        // Past capacity: more sessions than it takes among those the store assigns to it. (It
        // may still run a few whose rows moved on, until their next write is fenced.)
        if (int(n.sessions.size()) >= s_.node.sessions && assigned_here(ni) >= s_.node.sessions)
            violation("node " + n.name + " placed past its capacity (" + std::to_string(s_.node.sessions) +
                      "): " + sid(id) + " epoch " + std::to_string(epoch));
        s.node = ni;
        node_add(ni, id);
    }
    s.node = ni;
    s.run_epoch = epoch;
    s.paused = false;
    const int32_t wait = s.tool_ms + think_[s.tenant];
    // A parked session reads its KV back before its step: the parked share of the restore.
    s.gen_ms = gen_ms(n.sessions.size(), wait) + n.slow_ms + int32_t(n.kv_parked * s_.node.restore_ms);
    s.period = std::max(1, s.gen_ms + wait);
    s.seg_start = now_ + (restore ? s_.node.restore_ms : 0);
    ++s.seg;
    // Waiting for a node, or stopped where it was (hung, or PostgreSQL out): the earlier.
    int64_t from = s.waiting_since;
    if (s.stalled_since >= 0 && (from < 0 || s.stalled_since < from)) from = s.stalled_since;
    s.first_wait_ms = from >= 0 ? int32_t(std::min<int64_t>(s.seg_start - from, 1 << 30)) : 0;
    s.stalled_since = -1;
    s.waiting_since = -1;
    if (s.fault != kNone) {
        FaultOutcome & f = r_.faults[size_t(s.fault)];
        ++f.resumed;
        f.last_resume_s = std::max(f.last_resume_s, double(s.seg_start) / 1000.0 - f.at_s);
        s.fault = kNone;
    }
    if (pg_down_) {
        // Its first step cannot commit: it waits where it is for PostgreSQL.
        s.stalled_since = from >= 0 ? from : now_;
        s.paused = true;
        ++s.seg;
        pg_held_.push_back(id);
        return;
    }
    at(s.seg_start + int64_t(s.steps - s.done) * s.period, kEnd, id, s.seg);
}

void World::stop_run(uint32_t id) {
    Session & s = sessions_[id];
    if (s.node == kNone || s.paused) return;
    const int64_t ran = now_ - s.seg_start;
    const int32_t k = ran <= 0 ? 0 : int32_t(std::min<int64_t>(ran / s.period, s.steps - s.done));
    for (int32_t i = 0; i < k; ++i)
        count(r_.pg_commits, s.seg_start + int64_t(i + 1) * s.period);
    r_.steps += k;
    // Within the SLO: a step whose latency (the wait for a node, for a run's first step, plus
    // its model time) is at most 2 s.
    if (s.gen_ms <= 2000) r_.steps_in_slo += k - (k > 0 && s.first_wait_ms + s.gen_ms > 2000 ? 1 : 0);
    s.done += k;
    cluster::NodeSignals & sig = nodes_[size_t(s.node)].sig;
    sig.steps += k;
    sig.step_s += double(k) * s.gen_ms / 1000.0;
    ++s.seg;  // its pending end is stale
}

}  // namespace armada::sim::detail

// The simulated world (world.h): leases, load reports, watches, and the real brains' loops.

#include "sim/world.h"

#include <chrono>
#include <set>

namespace armada::sim::detail {

void World::report(int32_t ni) {
    publish(ni);
    at(now_ + s_.report_ms, kReport, uint32_t(ni));
}

void World::publish(int32_t ni) {
    Node & n = nodes_[size_t(ni)];
    if (n.up && !n.hung && !n.partitioned && !etcd_down_) {
        cluster::NodeLoad l;
        l.node = n.name;
        l.sessions = int(n.sessions.size());
        l.free_seqs = std::max(0, s_.node.sessions - l.sessions);
        l.cores = s_.node.cores;
        l.kv_headroom = int64_t(1) << 40;
        if (s_.node.kv_budget_mb > 0) {
            const double used = kv_bytes(ni), budget = s_.node.kv_budget_mb * 1048576.0;
            l.kv_budget = int64_t(budget);
            l.kv_headroom = std::max<int64_t>(0, int64_t(budget - used));
            n.kv_parked = used > budget ? 1.0 - budget / used : 0.0;
            r_.kv_peak_ratio = std::max(r_.kv_peak_ratio, used / budget);
        }
        l.step_ms = gen_ms(n.sessions.size(), 1000);
        l.seq = ++n.report_seq;
        l.version = n.version;
        l.draining = n.draining;
        n.last = l;
        n.reported = true;
        count(r_.etcd_writes, now_);
        if (!n.lease) renew_lease(ni);
        watch(ni, l);
    }
}

void World::watch(int32_t ni, std::optional<cluster::NodeLoad> l) {
    Node & n = nodes_[size_t(ni)];
    int64_t t = now_ + s_.watch_ms;
    if (s_.buggify && rng_.chance(0.05)) t += rng_.range(0, 500);
    if (n.watch_q.empty() && t == now_ + s_.watch_ms) return watch_apply(ni, l, t);
    t = std::max(t, n.watch_at);
    n.watch_at = t;
    n.watch_q.push_back(std::move(l));
    ++r_.watch_late;
    at(t, kWatch, uint32_t(ni));
}

void World::watch_deliver(int32_t ni) {
    Node & n = nodes_[size_t(ni)];
    if (n.watch_q.empty()) return;
    auto l = std::move(n.watch_q.front());
    n.watch_q.pop_front();
    watch_apply(ni, l, now_);
}

void World::watch_apply(int32_t ni, const std::optional<cluster::NodeLoad> & l, int64_t at_ms) {
    const Node & n = nodes_[size_t(ni)];
    Cell & c = cells_[size_t(n.cell)];
    if (!c.brain) return;  // no leader hears it; the next one reads the truth
    if (!l) return c.brain->node_down(n.name);
    c.brain->node_up(n.name);
    c.brain->load(*l, at_ms);
}

void World::renew_lease(int32_t ni) {
    Node & n = nodes_[size_t(ni)];
    n.lease = true;
    ++n.lease_gen;
    count(r_.etcd_writes, now_, 2);  // grant, put
    count(r_.leases, now_);
}

int64_t World::lease_end(const Node & n) const {
    const int64_t every = std::max(1, s_.lease_ttl_ms / 3);
    const int64_t last = now_ - ((now_ - n.phase) % every + every) % every;
    return last + s_.lease_ttl_ms;
}

void World::lease_check(int32_t ni, uint32_t gen) {
    Node & n = nodes_[size_t(ni)];
    if (gen != n.lease_gen || !n.lease || (n.up && !n.hung && !n.partitioned)) return;
    if (etcd_down_) {
        at(etcd_up_at_ + s_.lease_ttl_ms, kLeaseCheck, uint32_t(ni), gen);  // etcd renews leases on restart
        return;
    }
    n.lease = false;
    count(r_.etcd_writes, now_);
    watch(ni, std::nullopt);
}

void World::cell_tick(uint32_t ci) {
    Cell & c = cells_[ci];
    at(now_ + s_.cell_tick_ms, kCellTick, ci);
    if (!c.brain) return;
    cluster::CellBrain & b = *c.brain;
    if (!etcd_down_ && !pg_down_ && (c.last_reconcile < 0 || now_ - c.last_reconcile >= s_.reconcile_ms)) reconcile(ci);
    for (const auto & [id, epoch] : c.inbox)
        b.session_open(sid(id), "", epoch);
    c.inbox.clear();
    const auto t0 = std::chrono::steady_clock::now();
    const auto decisions = b.decide(now_);
    if (!decisions.empty())
        r_.place_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    for (const auto & p : decisions) {
        const uint32_t id = session_index(p.session);
        const int32_t ni = node_index(p.node);
        Session & s = sessions_[id];
        trace(now_, 100, id, uint32_t(ni), p.epoch);
        if (pg_down_) {  // the epoch cannot be written: the placement fails, to be tried again
            ++r_.store_refused;
            b.place_failed(p.session);
            continue;
        }
        count(r_.pg_commits, now_);
        if (!s.open || s.cell != int32_t(ci) || s.epoch >= p.epoch) {
            b.place_failed(p.session);  // someone moved it first: reconcile says where
            continue;
        }
        s.epoch = p.epoch;
        s.row_node = ni;
        b.place_done(p.session);
        if (!p.from.empty() && s.node == node_index(p.from) && !s.paused) {
            // Its draining node gives it up between steps; the new node takes its KV.
            stop_run(id);
            node_remove(s.node, id);
            s.node = kNone;
            s.waiting_since = now_;
            ++r_.rollout.drain_moves;
        }
        if (p.moved) count(r_.moves, now_);
        send(commit_delay() + s_.nats_ms, kRunMsg, id, uint32_t(ni), p.epoch);
    }
    if (now_ - c.last_report >= 1000) {
        c.last_report = now_;
        const auto r = cluster::cell_report(c.name, b.loads(now_), c.by_tenant, int(b.queued()));
        if (cell_free_.size() < cells_.size()) cell_free_.resize(cells_.size(), -1);
        cell_free_[ci] = r.free_seqs;
        // The brain writes it to etcd and pushes it on NATS; the global brain takes it from
        // either (as `armada global` does), so it goes silent only without both.
        const bool nats = !nats_down_ && c.nats_cut_until <= now_;
        if (!etcd_down_) count(r_.etcd_writes, now_);
        if (nats) count(r_.nats_msgs, now_);
        if (global_ && (nats || !etcd_down_)) global_->report(r, now_ + (nats ? s_.nats_ms : s_.watch_ms));
    }
}

void World::reconcile(uint32_t ci) {
    Cell & c = cells_[ci];
    c.last_reconcile = now_;
    std::set<std::string> live;
    for (int32_t i : nodes_of(int(ci)))
        if (nodes_[size_t(i)].lease) live.insert(nodes_[size_t(i)].name);
    std::vector<cluster::CellBrain::OpenSession> open;
    open.reserve(c.open.size());
    std::vector<int> per_tenant(s_.tenants.size(), 0);
    // A cell's sessions are scattered over millions: their records are fetched a few ahead.
    constexpr size_t kAhead = 8;
    for (size_t i = 0; i < c.open.size(); ++i) {
        if (i + kAhead < c.open.size()) __builtin_prefetch(&sessions_[c.open[i + kAhead]]);
        const uint32_t id = c.open[i];
        const Session & s = sessions_[id];
        open.push_back({sid(id), s.row_node == kNone ? "" : nodes_[size_t(s.row_node)].name, s.epoch});
        ++per_tenant[s.tenant];
    }
    c.by_tenant.clear();
    for (size_t t = 0; t < per_tenant.size(); ++t)
        if (per_tenant[t] > 0) c.by_tenant[s_.tenants[t].name] = per_tenant[t];
    c.brain->reconcile(live, open);
    for (int32_t i : nodes_of(int(ci)))
        if (nodes_[size_t(i)].lease && nodes_[size_t(i)].reported) c.brain->load(nodes_[size_t(i)].last, now_);
}

void World::global_tick() {
    at(now_ + s_.global_tick_ms, kGlobalTick);
    if (!global_) return;
    cluster::GlobalBrain & g = *global_;
    for (size_t ci = 0; ci < cells_.size(); ++ci) {
        bool any = !!cells_[ci].brain;
        for (int32_t i : nodes_of(int(ci)))
            any = any || nodes_[size_t(i)].lease;
        if (!any && !etcd_down_) g.leases_gone(cells_[ci].name);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto & name : g.lost_cells(now_)) {
        if (pg_down_) break;  // the open rows are read from PostgreSQL
        const Cell & c = cells_[size_t(std::stoi(name.substr(4)))];
        std::vector<cluster::GlobalBrain::OpenSession> open;
        for (uint32_t id : c.open)
            open.push_back({sid(id), s_.tenants[sessions_[id].tenant].name, sessions_[id].epoch});
        g.open_in(name, open);
    }
    const auto rehomes = g.decide(now_);
    const auto split = g.shares(now_);
    r_.split_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    for (const auto & rh : rehomes) {
        const uint32_t id = session_index(rh.session);
        Session & s = sessions_[id];
        const int to = std::stoi(rh.to.substr(4)), from = std::stoi(rh.from.substr(4));
        trace(now_, 101, id, uint32_t(to), rh.epoch);
        g.rehome_done(rh.session);
        if (pg_down_) {  // not written; the next read of the lost cell's rows lists it again
            ++r_.store_refused;
            continue;
        }
        count(r_.pg_commits, now_);
        if (!s.open || s.cell != from || s.epoch >= rh.epoch) continue;
        cell_remove(from, id);
        cell_add(to, id);
        s.cell = to;
        s.epoch = rh.epoch;
        s.row_node = kNone;
        count(r_.moves, now_);
        ++r_.rehomes;
        if (!cells_[size_t(from)].lost) ++r_.rehomes_from_live;
        send(commit_delay() + s_.nats_ms, kPlaceMsg, id, uint32_t(to), rh.epoch);
    }
    rollout_turn();
    if (!etcd_down_ && (split.full != last_split_.full || now_ - last_split_ms_ >= s_.shares_ms)) {
        last_split_ms_ = now_;
        if (!(split == last_split_)) {
            last_split_ = split;
            gw_shares_ = split;
            count(r_.etcd_writes, now_);
        }
    }
}

}  // namespace armada::sim::detail

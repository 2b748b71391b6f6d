// The simulated world (world.h): the run, its set-up and the session events.

#include "sim/world.h"

#include <chrono>

namespace armada::sim::detail {

SimResult World::run() {
    const auto wall0 = std::chrono::steady_clock::now();
    setup();
    const int64_t end = int64_t(s_.duration_s * 1000);
    Ev e{};
    while (q_.pop(e, end)) {
        now_ = e.t;
        trace(e.t, e.kind, e.a, e.b, e.c);
        handle(e);
    }
    now_ = end;
    finish();
    r_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return std::move(r_);
}

void World::trace(int64_t t, int kind, int64_t a, int64_t b, int64_t c) {
    for (int64_t v : {t, int64_t(kind), a, b, c}) {
        for (int i = 0; i < 8; ++i) {
            hash_ ^= uint64_t(v >> (8 * i)) & 0xff;
            hash_ *= 1099511628211ull;
        }
    }
    ++r_.events;
    if (o_.keep_trace) {
        r_.trace += std::to_string(t) + ' ' + std::to_string(kind) + ' ' + std::to_string(a) + ' ' + std::to_string(b) +
                    ' ' + std::to_string(c) + '\n';
    }
}

void World::send(int64_t base_ms, Kind k, uint32_t a, uint32_t b, int64_t c) {
    count(r_.nats_msgs, now_);
    int64_t d = now_ + base_ms;
    if (s_.buggify) {
        if (rng_.chance(0.05)) d += rng_.range(0, 500);
        // Lost on its way to the consumer, or taken by one that died before acking: JetStream
        // delivers it again after the ack wait (5 s). Place requests, run commands and
        // "ended" events alike.
        if (rng_.chance(0.01)) d += 5000;
        if (rng_.chance(0.01)) at(d + rng_.range(0, 200), k, a, b, c);
    }
    at(d, k, a, b, c);
}

void World::node_remove(int32_t ni, uint32_t id) {
    auto & v = nodes_[size_t(ni)].sessions;
    const Session & s = sessions_[id];
    size_t i = v.size();
    if (s.node == ni && s.node_pos >= 0 && size_t(s.node_pos) < v.size() && v[size_t(s.node_pos)] == id)
        i = size_t(s.node_pos);
    else
        i = size_t(std::find(v.begin(), v.end(), id) - v.begin());
    if (i >= v.size()) return;
    v[i] = v.back();
    v.pop_back();
    if (i < v.size() && sessions_[v[i]].node == ni) sessions_[v[i]].node_pos = int32_t(i);
}

void World::cell_remove(int32_t ci, uint32_t id) {
    auto & v = cells_[size_t(ci)].open;
    const auto i = size_t(sessions_[id].cell_pos);
    if (i >= v.size() || v[i] != id) return;
    v[i] = v.back();
    v.pop_back();
    if (i < v.size()) sessions_[v[i]].cell_pos = int32_t(i);
    sessions_[id].cell_pos = -1;
}

void World::setup() {
    const int nc = s_.cells, nn = s_.nodes_per_cell;
    std::vector<cluster::CellSpec> specs;
    for (int c = 0; c < nc; ++c) {
        Cell cell;
        cell.name = "cell" + std::to_string(c);
        cell.brain = std::make_unique<cluster::CellBrain>();
        cells_.push_back(std::move(cell));
        specs.push_back({cells_.back().name, s_.domains > 0 ? "d" + std::to_string(c % s_.domains) : "", s_.water});
    }
    global_ = std::make_unique<cluster::GlobalBrain>(specs);
    for (int c = 0; c < nc; ++c) {
        for (int i = 0; i < nn; ++i) {
            Node n;
            n.cell = c;
            n.name = cells_[size_t(c)].name + "-n" + std::to_string(i);
            n.phase = int32_t(rng_.range(0, s_.report_ms - 1));
            nodes_.push_back(std::move(n));
        }
    }
    for (size_t t = 0; t < s_.tenants.size(); ++t)
        think_.push_back(s_.tenants[t].think_ms);
    // Sessions already live: homed by tenant, spread over their cell's nodes, part-way through.
    std::vector<size_t> next_node(size_t(nc), 0);
    for (size_t t = 0; t < s_.tenants.size(); ++t) {
        const int cell = int(t % size_t(nc));
        for (int k = 0; k < s_.tenants[t].initial; ++k) {
            const uint32_t id = new_session(uint32_t(t), cell);
            Session & s = sessions_[id];
            s.done = int32_t(rng_.range(0, s.steps - 1));
            // Round-robin over the cell's nodes that have room.
            for (int tries = 0; tries < nn; ++tries) {
                const int32_t ni = int32_t(size_t(cell * nn) + next_node[size_t(cell)]++ % size_t(nn));
                if (int(nodes_[size_t(ni)].sessions.size()) < s_.node.sessions) {
                    s.row_node = ni;
                    s.epoch = 1;
                    start_run(id, ni, 1, false);
                    // Part-way through its current step too.
                    sessions_[id].seg_start -= rng_.range(0, sessions_[id].period - 1);
                    break;
                }
            }
        }
    }
    closed_started_.assign(s_.tenants.size(), 0);
    for (size_t t = 0; t < s_.tenants.size(); ++t) {
        if (s_.tenants[t].rate_per_s > 0)
            at(int64_t(rng_.exp(1000.0 / s_.tenants[t].rate_per_s)), kArrive, uint32_t(t));
        for (int k = 0; k < s_.tenants[t].concurrency; ++k) {
            if (s_.tenants[t].sessions > 0 && k >= s_.tenants[t].sessions) break;
            ++closed_started_[t];
            at(1, kArrive, uint32_t(t));
        }
    }
    for (size_t i = 0; i < nodes_.size(); ++i)
        at(nodes_[i].phase, kReport, uint32_t(i));
    for (int c = 0; c < nc; ++c)
        at(rng_.range(0, s_.cell_tick_ms - 1), kCellTick, uint32_t(c));
    at(s_.global_tick_ms, kGlobalTick);
    for (size_t f = 0; f < s_.faults.size(); ++f) {
        at(int64_t(s_.faults[f].at_s * 1000), kFault, uint32_t(f));
        r_.faults.push_back({fault_name(s_.faults[f]), s_.faults[f].at_s});
    }
    at(1000, kSecond);
}

uint32_t World::new_session(uint32_t tenant, int cell) {
    const TenantLoad & tl = s_.tenants[tenant];
    Session s;
    s.tenant = tenant;
    if (tl.concurrency > 0) {
        // A closed loop is the agents bench's workload: the same steps and tool time each.
        s.steps = int32_t(tl.steps);
        s.tool_ms = int32_t(tl.tool_ms);
    } else {
        s.steps = int32_t(rng_.range(1, std::max(1, 2 * tl.steps - 1)));
        if (tl.tool_dist == "constant")
            s.tool_ms = int32_t(tl.tool_ms);
        else if (tl.tool_dist == "uniform")
            s.tool_ms = int32_t(rng_.range(tl.tool_ms / 2, tl.tool_ms + tl.tool_ms / 2));
        else
            s.tool_ms = int32_t(std::clamp(rng_.exp(tl.tool_ms), tl.tool_ms / 10.0, tl.tool_ms * 5.0));
    }
    s.cell = cell;
    s.waiting_since = now_;
    sessions_.push_back(s);
    const auto id = uint32_t(sessions_.size() - 1);
    cell_add(cell, id);
    ++open_;
    ++r_.sessions_started;
    count(r_.pg_commits, now_);
    return id;
}

void World::handle(const Ev & e) {
    if (e.kind == kPlaceMsg || e.kind == kRunMsg || e.kind == kClosedMsg) {
        // JetStream cannot be reached (by anyone, or by the cell the message is for): the
        // message gets through once it can, spread over a second (the publisher retries, or
        // the stream already holds it). A session waiting on it counts as hit until it runs.
        const int cell = e.kind == kRunMsg ? nodes_[e.b].cell : int(e.b);
        const int64_t cut = cells_[size_t(cell)].nats_cut_until;
        if (nats_down_ || cut > now_) {
            const int32_t fault = nats_down_ ? nats_fault_ : cells_[size_t(cell)].nats_cut_fault;
            if (e.kind != kClosedMsg && sessions_[e.a].open && sessions_[e.a].fault == kNone) {
                sessions_[e.a].fault = fault;
                hit(fault);
            }
            const int64_t back = std::max(nats_down_ ? nats_up_at_ : 0, cut);
            at(back + s_.nats_ms + rng_.range(0, 1000), e.kind, e.a, e.b, e.c);
            return;
        }
    }
    switch (e.kind) {
        case kArrive:
            return arrive(e.a);
        case kPlaceMsg:
            return place_msg(e.a, e.b, e.c);
        case kRunMsg:
            return run_msg(e.a, int32_t(e.b), e.c);
        case kClosedMsg:
            if (cells_[e.b].brain) cells_[e.b].brain->session_closed(sid(e.a));
            return;
        case kEnd:
            return end(e.a, e.b);
        case kReport:
            return report(int32_t(e.a));
        case kCellTick:
            return cell_tick(e.a);
        case kGlobalTick:
            return global_tick();
        case kLeaseCheck:
            return lease_check(int32_t(e.a), e.b);
        case kFault:
            return fault(s_.faults[e.a], int32_t(e.a));
        case kWake:
            return wake(int32_t(e.a));
        case kRestart:
            return restart(int32_t(e.a));
        case kBrainUp:
            return brain_up(e.a);
        case kCellBack:
            return cell_back(e.a);
        case kEtcdUp:
            return etcd_up();
        case kSecond:
            return second();
        case kMovable:
            return movable(e.a, int32_t(e.b));
        case kDrainCheck:
            return drain_check(int32_t(e.a), e.b);
        case kHeal:
            return heal(int32_t(e.a));
        case kDiskOk:
            return slow_disk(int32_t(e.a), 0);
        case kNatsUp:
            if (now_ >= nats_up_at_) nats_down_ = false;
            return;
        case kPgUp:
            return pg_up();
        case kRetryOpen:
            return open_session(e.a);
        case kWatch:
            return watch_deliver(int32_t(e.a));
    }
}

void World::open_session(uint32_t tenant) {
    if (pg_down_) {
        // The gateway cannot write the row: the client is refused and tries again after.
        at(pg_up_at_ + rng_.range(0, 1000), kRetryOpen, tenant);
        return;
    }
    // The gateway: the split it follows, else the cell whose brain last reported most room.
    std::string cell = cluster::pick_cell(gw_shares_, s_.tenants[tenant].name);
    int c = 0;
    if (!cell.empty()) {
        c = std::stoi(cell.substr(4));
    } else {
        int best = -1;
        for (size_t i = 0; i < cells_.size(); ++i) {
            if (cell_free_.size() > i && cell_free_[i] > best) {
                best = cell_free_[i];
                c = int(i);
            }
        }
    }
    const uint32_t id = new_session(tenant, c);
    send(commit_delay() + s_.nats_ms, kPlaceMsg, id, uint32_t(c), 0);
}

void World::run_msg(uint32_t id, int32_t ni, int64_t epoch) {
    Session & s = sessions_[id];
    Node & n = nodes_[size_t(ni)];
    if (!n.up) return;  // a dead node's commands wait for it; its lease going moves the session
    if (n.hung || n.partitioned) {
        n.held_runs.emplace_back(id, epoch);
        return;
    }
    if (!s.open || s.epoch != epoch || s.row_node != ni) return;
    if (s.node == ni && !s.paused) {
        // Running here already (it was placed here again): it goes on under the new epoch.
        s.run_epoch = std::max(s.run_epoch, epoch);
        return;
    }
    start_run(id, ni, epoch, true);
}

void World::end(uint32_t id, uint32_t seg) {
    Session & s = sessions_[id];
    if (s.seg != seg || s.node == kNone || s.paused) return;
    Node & n = nodes_[size_t(s.node)];
    if (!n.up || n.hung) return;
    if (s.epoch != s.run_epoch) {
        // The row moved on (a partitioned node's session was placed elsewhere): its last
        // commit is refused, and the run stops here.
        stop_run(id);
        node_remove(s.node, id);
        s.node = kNone;
        s.waiting_since = now_;
        ++r_.fenced_writes;
        return;
    }
    stop_run(id);
    node_remove(s.node, id);
    (bad(n) ? n.sig.failed : n.sig.completed)++;
    if (bad(n)) ++r_.sessions_failed;  // its chain broke: the version failed its steps
    if (s.fault != kNone) {            // it ended on a partitioned node before it was moved: nothing to resume
        ++r_.faults[size_t(s.fault)].resumed;
        s.fault = kNone;
    }
    const int32_t cell = s.cell;
    s.node = kNone;
    s.open = false;
    s.waiting_since = -1;
    cell_remove(cell, id);
    --open_;
    ++r_.sessions_completed;
    r_.last_completed_ms = now_;
    // A closed loop starts the next session as this one ends.
    if (const TenantLoad & tl = s_.tenants[s.tenant];
        tl.concurrency > 0 && (tl.sessions == 0 || closed_started_[s.tenant] < tl.sessions)) {
        ++closed_started_[s.tenant];
        at(now_, kArrive, s.tenant);
    }
    count(r_.pg_commits, now_);
    if (n.partitioned)
        at(n.heal_at + s_.nats_ms, kClosedMsg, id, uint32_t(cell));  // NATS is out of its reach
    else
        send(s_.nats_ms, kClosedMsg, id, uint32_t(cell), 0);
}

}  // namespace armada::sim::detail

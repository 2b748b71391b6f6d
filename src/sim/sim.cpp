#include "sim/sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <unordered_map>

#include "cluster/cell_brain.h"
#include "cluster/global_brain.h"
#include "cluster/rollout.h"
#include "sim/splitmix.h"

namespace armada::sim {

namespace {

//! The run's one source of randomness.
struct Rng : SplitMix64 {
    double uniform() { return double(next() >> 11) / 9007199254740992.0; }  // [0, 1)
    double exp(double mean) { return -std::log(1.0 - uniform()) * mean; }
    int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
    bool chance(double p) { return uniform() < p; }
};

enum Kind : uint8_t {
    kArrive,     // a: tenant
    kPlaceMsg,   // a: session, b: cell, c: epoch (a place request reaches the cell's queue)
    kRunMsg,     // a: session, b: node, c: epoch (a run command reaches the node)
    kClosedMsg,  // a: session, b: cell (a node's "ended" event reaches the cell)
    kEnd,        // a: session, b: run counter (its last step is done)
    kReport,     // a: node
    kCellTick,   // a: cell
    kGlobalTick,
    kLeaseCheck,  // a: node, b: lease generation (its last keepalive + TTL)
    kFault,       // a: fault index
    kWake,        // a: node (a hang ends)
    kRestart,     // a: node (a crashed node starts again)
    kBrainUp,     // a: cell (a standby leads)
    kCellBack,    // a: cell (a lost cell's processes start again)
    kEtcdUp,
    kSecond,
    kMovable,     // a: session, b: node (a draining node offers it to its cell brain, between steps)
    kDrainCheck,  // a: node, b: its drain's number (empty yet, or past the drain timeout?)
    kHeal,        // a: node (a partition ends)
    kDiskOk,      // a: node (a slow disk is fast again)
    kNatsUp,      // NATS can be reached again
    kRetryOpen,   // a: tenant (a client whose session could not be created tries again)
    kWatch,       // a: node (the next event of its key reaches its cell brain's watch)
    kPgUp,        // PostgreSQL can be reached again
};

struct Ev {
    int64_t t;
    uint64_t seq;
    Kind kind;
    uint32_t a, b;
    int64_t c;
};
//! The pending events: a wheel of one slot per millisecond for the next ~17 minutes, and a map
//! for later ones. Each slot is a list through one pool of events, so scheduling allocates
//! nothing once the pool has grown. Events of one millisecond come out in the order they were
//! scheduled. (A heap of a million sessions' next events cost more than the brains themselves.)
class Calendar {
  public:
    Calendar() : head_(kSpan, kNil), tail_(kSpan, kNil) {}
    void push(const Ev & e) {
        if (e.t >= now_ + int64_t(kSpan)) {
            far_[e.t].push_back(e);
            return;
        }
        uint32_t i;
        if (free_ != kNil) {
            i = free_;
            free_ = next_of_[i];
            pool_[i] = e;
        } else {
            i = uint32_t(pool_.size());
            pool_.push_back(e);
            next_of_.push_back(kNil);
        }
        next_of_[i] = kNil;
        const size_t slot = size_t(std::max(e.t, now_)) % kSpan;
        if (tail_[slot] == kNil)
            head_[slot] = i;
        else
            next_of_[tail_[slot]] = i;
        tail_[slot] = i;
    }
    //! The next event at or before `end`; false when there is none.
    bool pop(Ev & out, int64_t end) {
        for (;;) {
            const size_t slot = size_t(now_) % kSpan;
            if (const uint32_t i = head_[slot]; i != kNil) {
                out = pool_[i];
                head_[slot] = next_of_[i];
                if (head_[slot] == kNil) tail_[slot] = kNil;
                next_of_[i] = free_;
                free_ = i;
                return true;
            }
            if (now_ >= end) return false;
            ++now_;
            // Later events enter the wheel as their millisecond comes within its span.
            while (!far_.empty() && far_.begin()->first < now_ + int64_t(kSpan)) {
                auto later = std::move(far_.begin()->second);
                far_.erase(far_.begin());
                for (const Ev & e : later)
                    push(e);
            }
        }
    }

  private:
    static constexpr size_t kSpan = size_t(1) << 20;
    static constexpr uint32_t kNil = ~uint32_t(0);
    std::vector<Ev> pool_;
    std::vector<uint32_t> next_of_, head_, tail_;
    uint32_t free_ = kNil;
    std::map<int64_t, std::vector<Ev>> far_;
    int64_t now_ = 0;
};

constexpr int32_t kNone = -1;
constexpr int64_t kGraceMs = 60000;  // an open session with no runner for longer is stranded

struct Session {
    uint32_t tenant = 0;
    int32_t steps = 0, done = 0, tool_ms = 0;
    // Its row in PostgreSQL.
    int32_t cell = 0, row_node = kNone;
    int64_t epoch = 0;
    bool open = true;
    // Its runner.
    int32_t node = kNone;
    int64_t run_epoch = 0, seg_start = 0;
    int32_t period = 1, gen_ms = 0;
    //! How long the run's first step waited for a node (placement, or a failover) before its model
    //! work began: part of that step's latency as its caller sees it.
    int32_t first_wait_ms = 0;
    uint32_t seg = 0;
    bool paused = false;        // its node hangs
    int64_t waiting_since = 0;  // -1 while it runs
    //! Since when its run has been stopped where it is (a hang, a PostgreSQL outage): -1 if not.
    int64_t stalled_since = -1;
    int32_t fault = kNone;  // the fault that took its runner, until it runs again
    int32_t node_pos = -1;  // its place in its node's list (while `node` is set)
    int32_t cell_pos = -1;  // its place in its cell's list of open sessions
};

struct Node {
    int32_t cell = 0;
    std::string name;
    bool up = true, hung = false, lease = true;
    // Cut off from etcd and NATS, not from PostgreSQL: it runs and commits, unseen, until heal_at.
    bool partitioned = false;
    int64_t heal_at = 0;
    int32_t partition_fault = kNone;
    int32_t slow_ms = 0;  // a slow disk: added to each step
    uint32_t lease_gen = 0;
    int32_t phase = 0;                                    // keepalive and report phase, ms
    std::vector<uint32_t> sessions;                       // the sessions it runs (a hung node also those moved away)
    std::vector<std::pair<uint32_t, int64_t>> held_runs;  // run commands that arrived while hung
    cluster::NodeLoad last;
    double kv_parked = 0;  // the share of its sessions' KV parked at its last report
    int64_t report_seq = 0;
    bool reported = false;
    // With buggify, the cell brain's watch can deliver this node's key late; what comes after
    // waits behind it (a watch keeps the order of one key's events). nullopt: the key deleted.
    std::deque<std::optional<cluster::NodeLoad>> watch_q;
    int64_t watch_at = 0;  // when the last queued event is delivered
    // Rollouts.
    std::string version = "v1", next_version;
    bool draining = false;
    uint32_t drains = 0;  // numbers its drains (a check of an earlier one is stale)
    int64_t drain_until = 0;
    int64_t acted_gen = 0;     // the restart generation it last carried out
    cluster::NodeSignals sig;  // steps of runs that stopped on this process; the rest is counted live
};

struct Cell {
    std::string name;
    int64_t nats_cut_until = 0;  // its brain and nodes cannot reach NATS until then
    int32_t nats_cut_fault = 0;
    std::unique_ptr<cluster::CellBrain> brain;  // null: no brain leads
    std::vector<std::pair<uint32_t, int64_t>> inbox;
    std::vector<uint32_t> closed;
    std::vector<uint32_t> open;  // open sessions whose row names this cell
    std::map<std::string, int> by_tenant;
    int64_t last_report = 0, last_reconcile = -1;
    bool lost = false;  // its processes are down (a fault)
};

std::string sid(uint32_t i) {
    return "s" + std::to_string(i);
}

class World {
  public:
    World(const Scenario & s, const SimOptions & o) : s_(s), o_(o), rng_{o.seed * 0x2545f4914f6cdd1dull + 1} {}

    SimResult run() {
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

  private:
    // ---- plumbing ----
    void at(int64_t t, Kind k, uint32_t a = 0, uint32_t b = 0, int64_t c = 0) { q_.push({t, seq_++, k, a, b, c}); }
    void trace(int64_t t, int kind, int64_t a, int64_t b, int64_t c) {
        for (int64_t v : {t, int64_t(kind), a, b, c}) {
            for (int i = 0; i < 8; ++i) {
                hash_ ^= uint64_t(v >> (8 * i)) & 0xff;
                hash_ *= 1099511628211ull;
            }
        }
        ++r_.events;
        if (o_.keep_trace) {
            r_.trace += std::to_string(t) + ' ' + std::to_string(kind) + ' ' + std::to_string(a) + ' ' +
                        std::to_string(b) + ' ' + std::to_string(c) + '\n';
        }
    }
    size_t sec(int64_t t) const { return size_t(std::max<int64_t>(0, t) / 1000); }
    void count(std::vector<int64_t> & v, int64_t t, int64_t n = 1) {
        const size_t i = sec(t);
        if (v.size() <= i) v.resize(i + 1);
        v[i] += n;
    }
    //! One more session a fault hit, now.
    void hit(int32_t fault) {
        FaultOutcome & f = r_.faults[size_t(fault)];
        ++f.sessions_hit;
        f.last_hit_ms = now_;
    }
    void violation(const std::string & what) {
        if (r_.violations.size() < 100) r_.violations.push_back({now_, what});
    }
    //! A message's delivery delay on NATS: with buggify, some are late, delivered twice (and so
    //! out of order), and some are lost once and redelivered after the ack wait.
    void send(int64_t base_ms, Kind k, uint32_t a, uint32_t b, int64_t c) {
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
    int64_t commit_delay() {
        int64_t d = s_.commit_ms;
        if (s_.buggify && rng_.chance(0.05)) d += rng_.range(0, 200);
        return d;
    }
    //! A cell's nodes are numbered together.
    std::vector<int32_t> nodes_of(int cell) const {
        std::vector<int32_t> out(size_t(s_.nodes_per_cell));
        for (int i = 0; i < s_.nodes_per_cell; ++i)
            out[size_t(i)] = cell * s_.nodes_per_cell + i;
        return out;
    }
    //! "cellC-nI" → its number.
    int32_t node_index(const std::string & name) const {
        const size_t dash = name.find("-n");
        return std::stoi(name.substr(4, dash - 4)) * s_.nodes_per_cell + std::stoi(name.substr(dash + 2));
    }
    uint32_t session_index(const std::string & id) const { return uint32_t(std::stoul(id.substr(1))); }

    //! The open sessions node `ni` runs whose rows name it (counted only near its capacity).
    int assigned_here(int32_t ni) const {
        int k = 0;
        for (uint32_t id : nodes_[size_t(ni)].sessions)
            k += sessions_[id].open && sessions_[id].row_node == ni;
        return k;
    }

    // ---- the node model ----
    //! The KV its open sessions hold in memory or parked: each its base and what its steps added.
    double kv_bytes(int32_t ni) const {
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
    //! Milliseconds of model work per step on a node running `n` sessions: its tokens per second
    //! are shared by the sessions generating at once (those not waiting on tools or users).
    int32_t gen_ms(size_t n, int32_t wait_ms) const {
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

    //! The measured decode rate over all sequences at `batch` sequences: linear between the
    //! curve's points, flat past its ends.
    double curve_at(double batch) const {
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

    // ---- membership lists, with O(1) insert and erase ----
    bool node_has(int32_t ni, uint32_t id) const {
        const Session & s = sessions_[id];
        const auto & v = nodes_[size_t(ni)].sessions;
        if (s.node == ni) return s.node_pos >= 0 && size_t(s.node_pos) < v.size() && v[size_t(s.node_pos)] == id;
        return std::find(v.begin(), v.end(), id) != v.end();  // a hung node's stale entry: rare
    }
    void node_add(int32_t ni, uint32_t id) {
        auto & v = nodes_[size_t(ni)].sessions;
        sessions_[id].node_pos = int32_t(v.size());
        v.push_back(id);
    }
    void node_remove(int32_t ni, uint32_t id) {
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
    void cell_add(int32_t ci, uint32_t id) {
        auto & v = cells_[size_t(ci)].open;
        sessions_[id].cell_pos = int32_t(v.size());
        v.push_back(id);
    }
    void cell_remove(int32_t ci, uint32_t id) {
        auto & v = cells_[size_t(ci)].open;
        const auto i = size_t(sessions_[id].cell_pos);
        if (i >= v.size() || v[i] != id) return;
        v[i] = v.back();
        v.pop_back();
        if (i < v.size()) sessions_[v[i]].cell_pos = int32_t(i);
        sessions_[id].cell_pos = -1;
    }

    void start_run(uint32_t id, int32_t ni, int64_t epoch, bool restore) {
        Session & s = sessions_[id];
        Node & n = nodes_[size_t(ni)];
        if (s.node != kNone && s.node != ni) {
            Node & old = nodes_[size_t(s.node)];
            if (old.up && !old.hung && node_has(s.node, id)) {
                if (s.run_epoch == epoch)
                    violation("session " + sid(id) + " runs on two live nodes in epoch " + std::to_string(epoch) +
                              ": " + old.name + " and " + n.name);
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

    //! The steps a run finished by now become durable (each a commit); the run stops.
    void stop_run(uint32_t id) {
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

    // ---- set-up ----
    void setup() {
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

    std::string fault_name(const Fault & f) const {
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

    uint32_t new_session(uint32_t tenant, int cell) {
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

    // ---- events ----
    void handle(const Ev & e) {
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

    void arrive(uint32_t tenant) {
        open_session(tenant);
        if (s_.tenants[tenant].rate_per_s > 0)
            at(now_ + std::max<int64_t>(1, int64_t(rng_.exp(1000.0 / s_.tenants[tenant].rate_per_s))), kArrive, tenant);
    }

    void open_session(uint32_t tenant) {
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

    void place_msg(uint32_t id, uint32_t cell, int64_t epoch) {
        // A request for a cell the session has left since is stale; the queue holds it until a
        // brain leads.
        if (!sessions_[id].open || sessions_[id].cell != int32_t(cell)) return;
        cells_[cell].inbox.emplace_back(id, epoch);
    }

    void run_msg(uint32_t id, int32_t ni, int64_t epoch) {
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

    void end(uint32_t id, uint32_t seg) {
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

    void report(int32_t ni) {
        publish(ni);
        at(now_ + s_.report_ms, kReport, uint32_t(ni));
    }

    //! The node writes its load to its key in etcd; the cell's brain hears it on its watch.
    void publish(int32_t ni) {
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

    //! An event of node `ni`'s key (a put with its load, or nullopt: deleted) reaches its cell
    //! brain's watch. With buggify, 5% come up to 500 ms late, and those after wait behind them.
    void watch(int32_t ni, std::optional<cluster::NodeLoad> l) {
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
    void watch_deliver(int32_t ni) {
        Node & n = nodes_[size_t(ni)];
        if (n.watch_q.empty()) return;
        auto l = std::move(n.watch_q.front());
        n.watch_q.pop_front();
        watch_apply(ni, l, now_);
    }
    void watch_apply(int32_t ni, const std::optional<cluster::NodeLoad> & l, int64_t at_ms) {
        const Node & n = nodes_[size_t(ni)];
        Cell & c = cells_[size_t(n.cell)];
        if (!c.brain) return;  // no leader hears it; the next one reads the truth
        if (!l) return c.brain->node_down(n.name);
        c.brain->node_up(n.name);
        c.brain->load(*l, at_ms);
    }

    void renew_lease(int32_t ni) {
        Node & n = nodes_[size_t(ni)];
        n.lease = true;
        ++n.lease_gen;
        count(r_.etcd_writes, now_, 2);  // grant, put
        count(r_.leases, now_);
    }

    //! The time a node's lease runs out if it stops renewing now: keepalives go every TTL/3.
    int64_t lease_end(const Node & n) const {
        const int64_t every = std::max(1, s_.lease_ttl_ms / 3);
        const int64_t last = now_ - ((now_ - n.phase) % every + every) % every;
        return last + s_.lease_ttl_ms;
    }

    void lease_check(int32_t ni, uint32_t gen) {
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

    //! The node stops: its runs' finished steps are durable, and the sessions wait for another
    //! node, marked with `fault` (if any, and none marks them yet). Returns how many it ran.
    int64_t release_runs(int32_t ni, int32_t fault) {
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

    void crash(int32_t ni, int32_t fault) {
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

    void restart(int32_t ni) {
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

    void hang(int32_t ni, double for_s, int32_t fault) {
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

    void wake(int32_t ni) {
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

    void partition(int32_t ni, double for_s, int32_t fault) {
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

    void heal(int32_t ni) {
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

    //! PostgreSQL is gone: every run stops at its last committed step and waits on its node.
    void pg_outage(double for_s, int32_t fault) {
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

    //! PostgreSQL is back: the held runs go on where the store still names their node.
    void pg_up() {
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

    //! Each step of the node takes `ms` more from now on: its runs are cut at this point and go
    //! on at the new pace.
    void slow_disk(int32_t ni, int32_t ms) {
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

    void cell_tick(uint32_t ci) {
        Cell & c = cells_[ci];
        at(now_ + s_.cell_tick_ms, kCellTick, ci);
        if (!c.brain) return;
        cluster::CellBrain & b = *c.brain;
        if (!etcd_down_ && !pg_down_ && (c.last_reconcile < 0 || now_ - c.last_reconcile >= s_.reconcile_ms))
            reconcile(ci);
        for (const auto & [id, epoch] : c.inbox)
            b.session_open(sid(id), "", epoch);
        c.inbox.clear();
        const auto t0 = std::chrono::steady_clock::now();
        const auto decisions = b.decide(now_);
        if (!decisions.empty())
            r_.place_us.push_back(
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
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

    //! The brain's view rebuilt from the truth: live nodes (their keys) and the cell's open rows.
    void reconcile(uint32_t ci) {
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

    void global_tick() {
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

    void brain_up(uint32_t ci) {
        Cell & c = cells_[ci];
        if (c.brain || c.lost) return;
        c.brain = std::make_unique<cluster::CellBrain>();
        c.last_reconcile = -1;  // a new leader starts from the truth
    }

    void cell_back(uint32_t ci) {
        Cell & c = cells_[ci];
        c.lost = false;
        brain_up(ci);
        for (int32_t i : nodes_of(int(ci)))
            restart(i);
    }

    void etcd_up() {
        etcd_down_ = false;
        // Every client comes back: all at once, or spread over a jittered pause.
        for (size_t i = 0; i < nodes_.size(); ++i) {
            const int64_t d = etcd_jitter_ ? rng_.range(0, 2000) : 0;
            count(r_.etcd_writes, now_ + d, 2);
        }
    }

    void fault(const Fault & f, int32_t fi) {
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

    // ---- rollouts ----
    //! The version the rollout goes to (the scenario's node processes start on "v1").
    static constexpr const char * kNewVersion = "v2";
    bool bad(const Node & n) const { return s_.rollout.bad && n.version == kNewVersion; }

    //! What a node's report carries: its counts since it started, the runs still going counted
    //! up to now (a run's steps are otherwise counted only when it stops).
    cluster::NodeSignals signals(int32_t ni) const {
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

    //! The global leader's turn: the live nodes to the real Rollout, its restart requests to the
    //! restarter (this simulator, standing for `armada cluster up`).
    void rollout_turn() {
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

    //! SIGTERM: the node turns unready and offers each session at its next step boundary.
    void begin_drain(int32_t ni, const std::string & version) {
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

    //! The node offers the session once its step under way is done.
    void offer_at_boundary(uint32_t id, int32_t ni) {
        const Session & s = sessions_[id];
        if (s.paused) return;
        const int64_t into = std::max<int64_t>(0, now_ - s.seg_start);
        at(now_ + (s.period - into % s.period) % s.period, kMovable, id, uint32_t(ni));
    }

    void movable(uint32_t id, int32_t ni) {
        Node & n = nodes_[size_t(ni)];
        const Session & s = sessions_[id];
        if (!n.draining || !n.up || n.hung || s.node != ni || !s.open) return;
        count(r_.nats_msgs, now_);
        if (Cell & c = cells_[size_t(n.cell)]; c.brain) c.brain->session_movable(sid(id), n.name, s.epoch);
    }

    void drain_check(int32_t ni, uint32_t drain) {
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

    void rollout_finish() {
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

    void second() {
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

    void finish() {
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
            if (c.lost || queued[size_t(s.cell)].count(uint32_t(id)) ||
                (c.brain && c.brain->node_of(sid(uint32_t(id))))) {
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

    const Scenario & s_;
    const SimOptions & o_;
    Rng rng_;
    Calendar q_;
    uint64_t seq_ = 0;
    int64_t now_ = 0;
    uint64_t hash_ = 1469598103934665603ull;
    SimResult r_;
    std::vector<Session> sessions_;
    std::vector<Node> nodes_;
    std::vector<Cell> cells_;
    std::vector<int32_t> think_;
    std::vector<int64_t> closed_started_;  // by tenant: sessions a closed loop started or is starting
    std::unique_ptr<cluster::GlobalBrain> global_;
    std::unique_ptr<cluster::Rollout> rollout_;
    int32_t rollout_fault_ = kNone;
    cluster::Shares gw_shares_, last_split_;
    int64_t last_split_ms_ = -1000000;
    std::vector<int> cell_free_;
    int64_t open_ = 0;
    bool etcd_down_ = false, etcd_jitter_ = true;
    int64_t etcd_up_at_ = 0;
    bool nats_down_ = false, pg_down_ = false;
    int64_t nats_up_at_ = 0, pg_up_at_ = 0;
    int32_t nats_fault_ = 0;
    std::vector<uint32_t> pg_held_;  // runs waiting for PostgreSQL
};

}  // namespace

SimResult run(const Scenario & s, const SimOptions & o) {
    return World(s, o).run();
}

}  // namespace armada::sim

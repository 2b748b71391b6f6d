#pragma once

// The simulated world: sessions, nodes and cells, and `World`, which runs the real brains and
// rollout over them. Private to src/sim/. Its parts:
// - world.cpp: the run, set-up and the session events (arrive, place, run, end);
// - node_model.cpp: what a node does with a session (KV, step times, runs);
// - control_plane.cpp: leases, load reports, watches and the brains' loops;
// - faults.cpp: crashes, hangs, partitions and outages, and their recoveries;
// - rollout_model.cpp: a rollout's drains and restarts;
// - report.cpp: per-second figures and the checks at the end.

#include "cluster/cell_brain.h"
#include "cluster/global_brain.h"
#include "cluster/rollout.h"
#include "sim/calendar.h"
#include "sim/sim.h"
#include "sim/splitmix.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace armada::sim::detail {

//! The run's one source of randomness.
struct Rng : SplitMix64 {
    double uniform() { return double(next() >> 11) / 9007199254740992.0; }  // [0, 1)
    double exp(double mean) { return -std::log(1.0 - uniform()) * mean; }
    int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
    bool chance(double p) { return uniform() < p; }
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

inline std::string sid(uint32_t i) {
    return "s" + std::to_string(i);
}

class World {
  public:
    World(const Scenario & s, const SimOptions & o) : s_(s), o_(o), rng_{o.seed * 0x2545f4914f6cdd1dull + 1} {}

    SimResult run();

  private:
    // ---- plumbing ----
    void at(int64_t t, Kind k, uint32_t a = 0, uint32_t b = 0, int64_t c = 0) { q_.push({t, seq_++, k, a, b, c}); }
    void trace(int64_t t, int kind, int64_t a, int64_t b, int64_t c);
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
    void send(int64_t base_ms, Kind k, uint32_t a, uint32_t b, int64_t c);
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
    double kv_bytes(int32_t ni) const;
    //! Milliseconds of model work per step on a node running `n` sessions: its tokens per second
    //! are shared by the sessions generating at once (those not waiting on tools or users).
    int32_t gen_ms(size_t n, int32_t wait_ms) const;

    //! The measured decode rate over all sequences at `batch` sequences: linear between the
    //! curve's points, flat past its ends.
    double curve_at(double batch) const;

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
    void node_remove(int32_t ni, uint32_t id);
    void cell_add(int32_t ci, uint32_t id) {
        auto & v = cells_[size_t(ci)].open;
        sessions_[id].cell_pos = int32_t(v.size());
        v.push_back(id);
    }
    void cell_remove(int32_t ci, uint32_t id);

    void start_run(uint32_t id, int32_t ni, int64_t epoch, bool restore);

    //! The steps a run finished by now become durable (each a commit); the run stops.
    void stop_run(uint32_t id);

    // ---- set-up ----
    void setup();

    std::string fault_name(const Fault & f) const;

    uint32_t new_session(uint32_t tenant, int cell);

    // ---- events ----
    void handle(const Ev & e);

    void arrive(uint32_t tenant) {
        open_session(tenant);
        if (s_.tenants[tenant].rate_per_s > 0)
            at(now_ + std::max<int64_t>(1, int64_t(rng_.exp(1000.0 / s_.tenants[tenant].rate_per_s))), kArrive, tenant);
    }

    void open_session(uint32_t tenant);

    void place_msg(uint32_t id, uint32_t cell, int64_t epoch) {
        // A request for a cell the session has left since is stale; the queue holds it until a
        // brain leads.
        if (!sessions_[id].open || sessions_[id].cell != int32_t(cell)) return;
        cells_[cell].inbox.emplace_back(id, epoch);
    }

    void run_msg(uint32_t id, int32_t ni, int64_t epoch);

    void end(uint32_t id, uint32_t seg);

    void report(int32_t ni);

    //! The node writes its load to its key in etcd; the cell's brain hears it on its watch.
    void publish(int32_t ni);

    //! An event of node `ni`'s key (a put with its load, or nullopt: deleted) reaches its cell
    //! brain's watch. With buggify, 5% come up to 500 ms late, and those after wait behind them.
    void watch(int32_t ni, std::optional<cluster::NodeLoad> l);
    void watch_deliver(int32_t ni);
    void watch_apply(int32_t ni, const std::optional<cluster::NodeLoad> & l, int64_t at_ms);

    void renew_lease(int32_t ni);

    //! The time a node's lease runs out if it stops renewing now: keepalives go every TTL/3.
    int64_t lease_end(const Node & n) const;

    void lease_check(int32_t ni, uint32_t gen);

    //! The node stops: its runs' finished steps are durable, and the sessions wait for another
    //! node, marked with `fault` (if any, and none marks them yet). Returns how many it ran.
    int64_t release_runs(int32_t ni, int32_t fault);

    void crash(int32_t ni, int32_t fault);

    void restart(int32_t ni);

    void hang(int32_t ni, double for_s, int32_t fault);

    void wake(int32_t ni);

    void partition(int32_t ni, double for_s, int32_t fault);

    void heal(int32_t ni);

    //! PostgreSQL is gone: every run stops at its last committed step and waits on its node.
    void pg_outage(double for_s, int32_t fault);

    //! PostgreSQL is back: the held runs go on where the store still names their node.
    void pg_up();

    //! Each step of the node takes `ms` more from now on: its runs are cut at this point and go
    //! on at the new pace.
    void slow_disk(int32_t ni, int32_t ms);

    void cell_tick(uint32_t ci);

    //! The brain's view rebuilt from the truth: live nodes (their keys) and the cell's open rows.
    void reconcile(uint32_t ci);

    void global_tick();

    void brain_up(uint32_t ci);

    void cell_back(uint32_t ci);

    void etcd_up();

    void fault(const Fault & f, int32_t fi);

    // ---- rollouts ----
    //! The version the rollout goes to (the scenario's node processes start on "v1").
    static constexpr const char * kNewVersion = "v2";
    bool bad(const Node & n) const { return s_.rollout.bad && n.version == kNewVersion; }

    //! What a node's report carries: its counts since it started, the runs still going counted
    //! up to now (a run's steps are otherwise counted only when it stops).
    cluster::NodeSignals signals(int32_t ni) const;

    //! The global leader's turn: the live nodes to the real Rollout, its restart requests to the
    //! restarter (this simulator, standing for `armada cluster up`).
    void rollout_turn();

    //! SIGTERM: the node turns unready and offers each session at its next step boundary.
    void begin_drain(int32_t ni, const std::string & version);

    //! The node offers the session once its step under way is done.
    void offer_at_boundary(uint32_t id, int32_t ni);

    void movable(uint32_t id, int32_t ni);

    void drain_check(int32_t ni, uint32_t drain);

    void rollout_finish();

    void second();

    void finish();

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

}  // namespace armada::sim::detail

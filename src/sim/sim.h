#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/scenario.h"

namespace armada::sim {

struct SimOptions {
    uint64_t seed = 1;
    bool keep_trace = false;  // keep the event trace's text (small runs), besides its hash
};

//! A failure of an invariant, at simulated time `t_ms`.
struct Violation {
    int64_t t_ms = 0;
    std::string what;
};

//! What a fault did to the sessions it hit.
struct FaultOutcome {
    std::string what;
    double at_s = 0;
    int sessions_hit = 0;                // open sessions on what failed
    int64_t last_hit_ms = 0;             // when the last of them was hit
    int resumed = 0;                     // of those, resumed elsewhere (or ended) by the end of the run
    double last_resume_s = -1;           // fault → the last hit session's next step began elsewhere
    int peak_moves_per_s = 0;            // re-placements and re-homes in the busiest second after it
    int64_t peak_etcd_writes_per_s = 0;  // in the busiest second of the minute after it
    int64_t peak_nats_msgs_per_s = 0;    // the same, NATS messages
    int64_t peak_pg_commits_per_s = 0;   // the same, PostgreSQL commits
};

//! What the scenario's rollout did, and what it cost the control plane while it ran.
struct RolloutOutcome {
    bool ran = false;
    std::string phase;  // the real Rollout's phase at the end: done, halted, running...
    std::string fired;  // the gate that halted it
    int waves = 0;
    double started_s = 0, ended_s = -1;  // ended: when it left running (-1: still running)
    int restarts = 0;                    // node restarts carried out (rollbacks included)
    int nodes_on_new = 0;                // live nodes on the new version at the end
    int64_t drain_moves = 0;             // sessions moved off draining nodes, between steps
    int64_t failed_over = 0;             // sessions still on a node at its drain timeout
    // The busiest second while it ran.
    int64_t peak_etcd_writes_per_s = 0, peak_leases_per_s = 0, peak_nats_msgs_per_s = 0, peak_moves_per_s = 0;
    int64_t peak_pg_commits_per_s = 0;
    std::vector<std::string> gates;  // the last wave's gate readings, as `armada rollout status` prints them
};

struct SimResult {
    uint64_t trace_hash = 0;  // over every event and decision, in order
    uint64_t events = 0;
    std::string trace;  // with keep_trace
    double wall_s = 0;
    // The real brains' wall time per call, in microseconds.
    std::vector<double> place_us;  // CellBrain::decide, calls that placed something
    std::vector<double> split_us;  // GlobalBrain::shares + decide
    // Per simulated second.
    std::vector<int64_t> etcd_writes, nats_msgs, pg_commits, moves;
    std::vector<double> balance;  // max / mean sessions over the live nodes that run any
    std::vector<int64_t> live;    // open sessions
    int64_t sessions_started = 0, sessions_completed = 0;
    int64_t sessions_failed = 0;    // of the completed, those that ended on a bad version (their chain broke)
    int64_t last_completed_ms = 0;  // simulated time of the last session's end
    //! Open at the end with no node for over a minute: waiting for room (queued), or forgotten
    //! or passed over while there was room (stranded: an invariant broken).
    int64_t sessions_queued = 0, sessions_stranded = 0;
    int64_t steps = 0, steps_in_slo = 0;  // steps whose model part took at most 2 s
    int64_t fenced_writes = 0;            // writes of a woken node refused by the epoch
    int64_t store_refused = 0;            // placements and re-homes not written: PostgreSQL was out
    int64_t rehomes = 0;                  // sessions the global brain moved to another cell
    int64_t rehomes_from_live = 0;        // of those, from a cell whose processes were not down
    double kv_peak_ratio = 0;             // the most KV a node held, over its budget (0: KV not modelled)
    int64_t watch_late = 0;               // etcd watch events buggify delivered late (or behind a late one)
    std::vector<int64_t> leases;          // leases granted, per simulated second
    std::vector<FaultOutcome> faults;
    RolloutOutcome rollout;
    std::vector<Violation> violations;
};

//! Runs `s` under `o.seed`: the real CellBrain and GlobalBrain classes, around them simulated
//! nodes, etcd (leases, watches, elections), NATS and PostgreSQL (commits, fencing) on one seeded
//! clock. Deterministic: the same scenario and seed give the same trace.
SimResult run(const Scenario & s, const SimOptions & o);

}  // namespace armada::sim

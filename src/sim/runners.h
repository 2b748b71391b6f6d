#pragma once

// The simulator's second world: the cluster's own runners (CellRunner, GlobalRunner, NodeAgent),
// not models of them, over the seams' in-memory fakes (MemoryKv for etcd, MemoryBus for NATS,
// MemoryStore for PostgreSQL) and one clock the world moves. Brains campaign through leases with
// `Elected`'s election code (`stand`, `election_leader`, `lease_step`: a loop that stops beating
// gives its lease up), one turn at a time rather than on threads of their own; nodes hold
// leases and report their load, a gateway creates sessions, and a seeded nemesis injects faults.
// The invariants are checked from what the runners did: the runs the node agents started, the
// steps the store acknowledged, and the assignments the brains wrote.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace armada::sim {

struct RunnerScenario {
    std::string name = "runners";
    int cells = 2;
    int nodes_per_cell = 3;
    int brains_per_cell = 2;
    int globals = 2;
    int sessions = 40;  // created over the first half of the fault window
    int steps = 3;      // steps (tool calls) per session
    int step_ms = 700;  // one step's time on a node
    int capacity = 16;  // sessions a node runs at once
    int lease_ttl_ms = 3000;
    int reconcile_ms = 3000;    // a cell brain's full reconcile, as `armada cell` does it
    int tick_ms = 100;          // the world's step: every process takes a turn
    double fault_s = 60;        // faults are injected during this window
    double arrive_s = -1;       // sessions arrive over this window (-1: the first half of fault_s)
    double duration_s = 150;    // then everything must complete by this time
    double faults_per_s = 0.2;  // the nemesis's rate
    bool faults = true;
    //! Whether every session must complete by duration_s (a run at scale may end with sessions
    //! still open: it measures the control plane's load, not a drain).
    bool complete = true;
};

//! A runner scenario from YAML (`world: runners`, then RunnerScenario's fields by name); unknown
//! keys are refused.
std::optional<RunnerScenario> parse_runner_scenario(const std::string & yaml, std::string & error);

struct RunnerResult {
    std::vector<std::string> violations;
    std::vector<std::string> faults;  // "t=12.3s kill -9 cell0-n1", in order
    int sessions = 0, completed = 0;
    int64_t steps_acked = 0;
    int64_t runs = 0;            // runs the node agents started
    int64_t fenced = 0;          // writes the store refused to a node that no longer held a session
    int64_t rehomes = 0;         // sessions moved to another cell
    int64_t leader_changes = 0;  // terms begun, over every election
    int64_t store_reads = 0, store_rows = 0, kv_calls = 0, kv_db_bytes = 0;
    //! From a node's death (kill -9, or the lease of a stopped one going) to the first of its
    //! sessions running elsewhere, for each such failover.
    std::vector<int64_t> failover_ms;
    double sim_s = 0;             // simulated seconds run
    int64_t kv_writes = 0;        // puts, deletes and transactions that etcd applied
    int64_t kv_db_bytes_max = 0;  // the largest backend size sampled (every 10 s)
    int64_t bus_messages = 0;     // messages published (kept and fire-and-forget)
    bool complete = true;         // the scenario required every session to complete
    bool ok() const { return violations.empty() && (!complete || completed == sessions); }
};

//! Runs one seed of `s`.
RunnerResult run_runners(const RunnerScenario & s, uint64_t seed);

}  // namespace armada::sim

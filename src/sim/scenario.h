#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace armada::sim {

//! One tenant's workload: sessions arrive at `rate_per_s` (Poisson), each takes `steps` model
//! steps (uniform 1..2×steps-1, so the mean is `steps`), each step waits for a tool call of about
//! `tool_ms` (exponential) and `think_ms` of the user's time.
struct TenantLoad {
    std::string name;
    double rate_per_s = 1;
    int steps = 6;
    int tool_ms = 1000;
    //! How a session's tool time is drawn around `tool_ms`: "exponential" (clamped to 0.1–5×),
    //! "uniform" (0.5–1.5×) or "constant". A closed loop always uses `tool_ms` as it is.
    std::string tool_dist = "exponential";
    int think_ms = 0;
    int initial = 0;  // sessions already live when the run starts
    //! A closed loop instead of arrivals (as `armada bench agents --concurrency`): this many
    //! sessions in flight from the start, a new one each time one ends, `sessions` in all (0: no
    //! end). `rate_per_s` is then 0.
    int concurrency = 0;
    int sessions = 0;
};

//! A fault injected at `at_s` (simulated seconds).
struct Fault {
    //! Partition: the node keeps running but reaches neither etcd nor NATS (its lease lapses, its
    //! sessions move, its next commits for them are fenced). SlowDisk: each of the node's steps
    //! takes `ms` longer (its checkpoint's fsync) for `for_s`.
    //! NatsOutage: JetStream cannot be reached for `for_s`; what is published meanwhile (run
    //! commands, place requests, ended events, cell reports to the global brain) gets through
    //! once it is back, the publishers retrying. PgOutage: PostgreSQL cannot be reached for `for_s`;
    //! no step, placement or re-home commits, so every run stops at its last committed step and
    //! goes on where it was once it is back. NatsPartition: one cell (its brain and nodes)
    //! cannot reach NATS for `for_s`, the rest of the cluster can; it still reaches etcd and
    //! PostgreSQL.
    enum class Kind {
        NodeCrash,
        NodeHang,
        CellLost,
        BrainCrash,
        EtcdRestart,
        RestartStorm,
        Partition,
        SlowDisk,
        NatsOutage,
        PgOutage,
        NatsPartition
    };
    Kind kind = Kind::NodeCrash;
    double at_s = 0;
    int cell = 0;
    int node = 0;        // within the cell
    double for_s = 0;    // hang, outage, partition or slow disk length
    int ms = 0;          // slow disk: added to each step
    bool jitter = true;  // restarts: reconnects spread over a random delay, or all at once
};

//! The measured single-node figures the simulated nodes run by (docs/BENCHMARKS.md).
struct NodeModel {
    int sessions = 256;            // sessions a node takes (--cluster-sessions)
    double tokens_per_s = 55;      // generated tokens per second over all its sequences
    double seq_tokens_per_s = 20;  // one sequence alone
    int step_tokens = 64;          // tokens generated per step
    int restore_ms = 150;          // a moved session's KV restored from its checkpoint
    int cores = 2;
    //! Prompt tokens read per second over all its sequences (0: prefill not modelled), and the
    //! new prompt tokens each step reads (a tool's output and the chat template around it; the
    //! shared instruction is a cached prefix).
    double prefill_tokens_per_s = 0;
    int step_prompt_tokens = 0;
    //! Measured decode rates by batch: (sequences, tokens per second over all of them), batch
    //! ascending. When given, a step's rate is read off it (linear between points, flat past the
    //! ends) instead of from `tokens_per_s` and `seq_tokens_per_s`.
    std::vector<std::pair<double, double>> decode_curve;
    //! KV memory (off while `kv_budget_mb` is 0). A session holds `kv_base_tokens` (its
    //! instruction, tools and first input) and gains `kv_step_tokens` a step, `kv_bytes_per_token`
    //! each. Past the node's budget, the share of its sessions' KV over it is parked (RAM to disk),
    //! and a step of a parked session first restores it (`restore_ms`): each step then pays that
    //! share of `restore_ms`. Each report carries the node's KV headroom and budget, which the
    //! cell brain places by.
    double kv_budget_mb = 0;
    int kv_base_tokens = 1300;
    int kv_step_tokens = 100;
    int kv_bytes_per_token = 6144;
};

//! A rolling upgrade run by the real `cluster::Rollout` from `at_s`: each node asked to restart
//! drains (its cell brain moves its sessions away between steps, KV along), exits, and is back on
//! the new version `restart_s` plus up to `jitter_s` later.
struct RolloutPlan {
    bool on = false;
    double at_s = 60;
    double wave_percent = 5;
    int max_per_cell = 1;
    double settle_s = 30;
    double restarts_per_s = 20;
    double restart_s = 10;
    double jitter_s = 1;
    double drain_timeout_s = 60;  // sessions still on the node then take the failover path
    bool bad = false;             // the new version fails every model step: the gates must halt it
};

//! A simulated cluster and what happens to it: read from YAML by `parse_scenario`.
struct Scenario {
    std::string name = "scenario";
    int cells = 2;
    int nodes_per_cell = 4;
    double water = 0.57;
    int domains = 0;  // fault domains the cells are spread over (0: none)
    NodeModel node;
    std::vector<TenantLoad> tenants;
    std::vector<Fault> faults;
    RolloutPlan rollout;
    double duration_s = 60;
    int lease_ttl_ms = 3000;
    int report_ms = 1000;       // node load reports
    int cell_tick_ms = 100;     // a cell brain's loop
    int global_tick_ms = 1000;  // the global brain's loop
    int shares_ms = 5000;       // the split is written at least this often
    int reconcile_ms = 10000;   // a cell brain rebuilds its view from etcd and PostgreSQL
    int commit_ms = 4;          // PostgreSQL commit latency
    int nats_ms = 2;            // NATS delivery latency
    int watch_ms = 5;           // etcd watch delivery latency
    //! FoundationDB-style fault injection at the adapter seams: messages delayed, lost, duplicated
    //! or reordered, and commits slowed, at random (from the seed).
    bool buggify = false;
};

//! The scenario in `text`, or nullopt with `error` set (it names the field).
std::optional<Scenario> parse_scenario(const std::string & text, std::string & error);

}  // namespace armada::sim

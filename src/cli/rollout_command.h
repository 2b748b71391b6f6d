#pragma once

#include "cluster/cluster_config.h"

#include <cstdint>
#include <set>
#include <string>

namespace armada::cli {

struct RolloutOptions {
    std::string cluster_file;
    std::string action;  // start, status, pause, resume, abort
    // start
    std::string version;
    double wave_percent = 5;
    int max_per_cell = 1;
    int settle_s = 120;
    int watch_before_s = -1;  // -1: the settle time, at most 60 s
    int ready_timeout_s = 600;
    double restarts_per_s = 2;
    int gate_min_sessions = 10;
    int gate_min_steps = 30;
    double gate_latency_ratio = 1.5;
    double gate_error_ratio = 2.0;
    double gate_error_floor = 0.02;
    double gate_success_drop = 0.05;
    double gate_heartbeat_excess = 0.5;
    //! The start flags given on the command line ("--settle", ...): the others come from the
    //! cluster file's `rollout:` section, or are the defaults above.
    std::set<std::string> given;
    // status
    bool json = false;
    // abort
    bool rollback = false;
};

//! `armada rollout start|status|pause|resume|abort`: reads and writes `<prefix>/rollout/` in
//! etcd only. The leading global brain runs the rollout (cluster::Rollout) from there, so it
//! survives a brain failover. Returns the exit code.
int rollout_command(const RolloutOptions & o);

//! The rollout `start` writes: each setting from its flag when given, else from `d` (the cluster
//! file's `rollout:`), else the default. Its id and start time are `now_ms`'.
cluster::RolloutSpec rollout_spec(const RolloutOptions & o, const cluster::RolloutDefaults & d, int64_t now_ms);

}  // namespace armada::cli

#pragma once

#include <string>

namespace armada::cli {

struct CellOptions {
    std::string cluster_file;
    std::string cell;
    std::string name;  // in the election; default HOSTNAME-PID
    int reconcile_ms = 3000;
    std::string log_level = "info";
    std::string metrics_host = "127.0.0.1";
    int metrics_port = -1;  // /metrics for Prometheus (0: any free port; -1: none)
};

//! `armada cell`: a cell brain. Every brain of a cell campaigns in etcd; the leader places the
//! cell's sessions on its nodes and re-places those of nodes whose lease expired, the others
//! wait to lead. Runs until SIGINT/SIGTERM. Returns the process exit code.
int cell_command(const CellOptions & o);

}  // namespace armada::cli

#pragma once

#include <string>

namespace armada::cli {

struct GlobalOptions {
    std::string cluster_file;
    std::string name;      // in the election; default HOSTNAME-PID
    int tick_ms = 1000;    // how often cells are read and lost ones handed over
    int shares_ms = 5000;  // how often the split of new sessions is written
    std::string log_level = "info";
    std::string metrics_host = "127.0.0.1";
    int metrics_port = -1;  // /metrics for Prometheus (0: any free port; -1: none)
    //! How rollouts restart nodes: "cluster-up" (request keys in etcd that `armada cluster up`
    //! carries out), "kubernetes" (each cell's nodes are a StatefulSet's pods: the rollout drives
    //! its partition, with the pod's service account) or "none" (a rollout halts at once, saying
    //! so).
    std::string restarter = "none";
    //! Kubernetes: the nodes' image for a version, `{version}` replaced; empty: the image stays and
    //! only the version label changes.
    std::string kube_image;
};

//! `armada global`: the global brain. Every one campaigns in etcd; the leader reads the cells'
//! aggregate reports, writes the split of new sessions that gateways follow, and re-homes the
//! open sessions of a lost cell to the others. Runs until SIGINT/SIGTERM; returns the exit code.
int global_command(const GlobalOptions & o);

}  // namespace armada::cli

#pragma once

#include <string>

namespace armada::cli {

struct DrainOptions {
    std::string cluster_file;
    std::string node;
    std::string api_key;  // an admin key the node knows
    bool wait = false;    // until the node has left the cluster
    int timeout_s = 600;  // of the wait
};

//! `armada cell drain NODE`: finds the node in etcd and asks it to drain (`POST /admin/drain`,
//! the same drain as SIGTERM): it turns unready, takes nothing new, finishes its running steps
//! and leaves, and its cell's brain gives its sessions to other nodes. With `wait`, returns once
//! its key is gone from etcd. Returns the exit code.
int drain_command(const DrainOptions & o);

}  // namespace armada::cli

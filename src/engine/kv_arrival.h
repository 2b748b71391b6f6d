#pragma once

// How a session's KV came to this node from another (a drain, a rebalance, a lost node): the
// node agent fetches it (cluster/runtime/node_agent.h) and the session records it as its "moved"
// step (agent/session_manager.h). One struct for both, so the two can never drift apart.

#include <cstdint>
#include <string>

namespace armada::engine {

struct KvArrival {
    std::string from;       // the node it ran on
    std::string kv_source;  // "transfer": its KV journal came along; "none": it re-prefills
    std::string error;      // why the KV did not come ("none")
    uint64_t bytes = 0;     // of the journal received
    int64_t tokens = 0;     // the KV's tokens
    int64_t ms = 0;         // fetching and installing it
};

}  // namespace armada::engine

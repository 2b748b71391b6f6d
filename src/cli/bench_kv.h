#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace armada::cli {

//! Options of `armada bench kv`: session memory measured on one model.
struct BenchKvOptions {
    std::string model;
    std::vector<int> contexts = {1024, 4096, 8192};  // resume latency: tokens held by the session
    int repeats = 3;                                 // medians are reported
    int threads = 0;
    int prefix_tokens = 700;  // shared-prefix TTFT: the agent's instructions + tool schemas
    int sessions = 2000;      // capacity: sessions created, then all resumed once
    int session_tokens = 128;
    int seqs = 16;              // sequences of the capacity engine
    std::string budget = "2G";  // --kv-budget of the capacity engine
    std::string disk = "64G";   // its disk tier
    bool skip_latency = false, skip_prefix = false, skip_capacity = false;
    bool capacity_without_parking = true;  // also run the capacity phase with parking off
    double max_rss_overhead_mb = 0;        // > 0: fail if peak RSS > budget + weights + this
    int cache_flood = 0;  // > 0: that many anonymous requests with distinct prompts fill the prompt cache
    std::string dir;      // spill directory (default: a temporary one)
    std::string output;   // Markdown report, optional
};

int bench_kv(const BenchKvOptions & opt);

}  // namespace armada::cli

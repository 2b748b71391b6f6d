#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace armada::bench {

//! Tool latency distribution: constant, uniform or lognormal, in seconds.
struct LatencyDist {
    std::string kind = "constant";  // constant | uniform | lognormal
    double a = 1.0;                 // constant: value; uniform: low; lognormal: mean
    double b = 0.0;                 // uniform: high; lognormal: sigma of the underlying normal
    //! Parses "constant:1", "uniform:0.5,1.5", "lognormal:1,0.5"; returns an error message.
    static std::string parse(const std::string & text, LatencyDist & out);
    std::string describe() const;
};

//! One workload against one target.
struct AgentsBenchOptions {
    std::string target;             // base URL, e.g. http://127.0.0.1:8080
    std::string mode = "sessions";  // sessions (Armada's server-side loop) | chat (any /v1/chat/completions)
    std::string label;              // name of the target in reports (default: mode)
    std::string model;              // "model" field for chat mode
    std::string api_key;
    int sessions = 64;
    int concurrency = 16;  // closed loop: sessions in flight
    double rate = 0;       // > 0: open loop, new sessions per second (Poisson)
    int steps = 3;         // tool steps per session; then one answer
    int user_turns = 1;    // chat mode: user messages per conversation, each followed by steps + answer
    double think_s = 0;    // chat mode: the user's think time before each turn after the first
    int instruction_tokens = 700;
    int tools = 4;
    LatencyDist tool_latency;
    int tool_output_tokens = 64;
    int step_tokens = 64;    // max tokens of each tool step (random weights spell a call in ~40)
    int answer_tokens = 32;  // max tokens of the final answer
    uint32_t seed = 42;
    int timeout_s = 600;  // per HTTP exchange
    int server_pid = 0;   // > 0: sample this process's RSS
    std::string output;   // prefix: writes PREFIX.json and PREFIX.md
    bool progress = true;
    // Fault pre-test: SIGKILL the server (server_pid) after kill_after_s, then run restart_cmd.
    double kill_after_s = 0;
    std::string restart_cmd;
    double retry_s = 0;  // keep retrying a request that got no HTTP answer for this long
};

//! Applies a preset of the seed's three load groups: "throughput" (short inference ceiling),
//! "mixed" (multi-turn agents with tools) or "fault" (mixed, with the server killed partway).
//! Returns an error message for an unknown name.
std::string apply_preset(const std::string & name, AgentsBenchOptions & o);

int agents_bench(const AgentsBenchOptions & opt);

//! `armada bench plot`: throughput and p95 against concurrency for several result files.
int plot_results(const std::vector<std::string> & files, const std::string & out_prefix);

//! `armada bench plan`: sessions per node at a safe water level, and nodes for a target.
//! Sessions per node at `water_level` from a result, by the two limits that can bind: the
//! concurrency measured and the memory (`node_memory` bytes; KV and RSS per session measured).
int plan_capacity(const std::string & file, double water_level, int64_t target_sessions, uint64_t node_memory);

}  // namespace armada::bench

#pragma once

// A rolling upgrade of a fleet's nodes, as pure decision code: the global leader feeds it the
// live nodes and the operator's commands, and carries out the restarts it asks for. No I/O,
// clock, thread or socket; its whole state is a value that the leader keeps in etcd, so a new
// leader resumes the rollout where the old one left it.
//
// Waves: each picks at most `wave_percent` of the fleet, cell by cell, and restarts its nodes
// with at most `max_per_cell` of a cell restarting at once. Once the whole wave is back on the
// new version, four signals are watched for `settle_ms` on the wave's nodes and compared with
// the rest of the fleet and with the fleet before the wave. A gate fires only when the wave is
// worse than both; then the rollout halts and the wave goes back to the version it ran.

#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace armada::cluster {

//! What a node counts since its process started (so a restart starts them over), carried in its
//! load report.
struct NodeSignals {
    int64_t started_ms = 0;                 // wall clock; a new value is a new process
    int64_t steps = 0;                      // model steps taken, failed ones included
    double step_s = 0;                      // their time, summed
    int64_t completed = 0;                  // sessions ended completed
    int64_t failed = 0;                     // sessions ended failed, timed out or lost
    std::map<std::string, int64_t> errors;  // by code: model, tool, http_5xx, store
    int64_t renew_late = 0;                 // lease renewals late by over twice the report period
    int64_t renew_failed = 0;               // lease renewals that failed
    int64_t lease_lost = 0;                 // leases found gone
    bool operator==(const NodeSignals &) const = default;
};

//! Signals summed over a group of nodes over some time.
struct GroupSignals {
    double node_minutes = 0;
    int64_t steps = 0;
    double step_s = 0;
    int64_t completed = 0;
    int64_t failed = 0;
    std::map<std::string, int64_t> errors;
    int64_t heartbeat = 0;  // anomalies: late or failed renewals, lost leases, vanished keys
    void add(const GroupSignals & o);
    bool empty() const { return node_minutes == 0 && steps == 0 && completed + failed == 0 && heartbeat == 0; }
    bool operator==(const GroupSignals &) const = default;
};

//! When a wave's signals halt the rollout. Each gate needs a minimum sample on the wave.
struct RolloutGates {
    double success_drop = 0.05;     // task success below min(rest, before) by more than this
    int min_sessions = 10;          // sessions ended on the wave, to judge success
    double latency_ratio = 1.5;     // mean step latency above max(rest, before) times this
    int min_steps = 30;             // steps on the wave, to judge latency and error codes
    double error_ratio = 2.0;       // errors of a code per step above max(rest, before) times this...
    double error_floor = 0.02;      // ...plus this
    double heartbeat_excess = 0.5;  // anomalies per node-minute above max(rest, before) plus this
    double min_node_minutes = 0.2;  // node-minutes on the wave, to judge heartbeats
    bool operator==(const RolloutGates &) const = default;
};

struct RolloutSpec {
    std::string id;
    std::string version;
    double wave_percent = 5;
    int max_per_cell = 1;
    int64_t settle_ms = 120000;
    int64_t ready_timeout_ms = 600000;
    double restarts_per_s = 2;
    bool ordinal_desc = false;  // a StatefulSet's pods go highest ordinal first
    //! The fleet is watched this long before the first wave, so its gates compare with a
    //! "before" too (later waves have the previous settle). From the brain that runs it.
    int64_t before_ms = 0;
    RolloutGates gates;
    int64_t at_ms = 0;  // when it was started (wall clock)
    bool operator==(const RolloutSpec &) const = default;
};

//! An operator's command: pause, resume or abort (with `rollback`, every upgraded node goes back).
struct RolloutCommand {
    std::string id;  // the rollout it is meant for
    int64_t seq = 0;
    std::string op;
    bool rollback = false;
};

//! A live node as its load report shows it.
struct FleetNode {
    std::string node;
    std::string cell;
    std::string version;
    bool draining = false;
    NodeSignals signals;
};

//! "Drain `node`, stop it, start it at `version`": idempotent per `gen`.
struct RestartRequest {
    std::string cell, node, version;
    int64_t gen = 0;
    bool back = false;  // a rollback: the node goes back to the version it ran before
    bool operator==(const RestartRequest &) const = default;
};

//! A node of the current wave. Phases: pending (picked, not restarted yet), restarting, ready,
//! rolling_back, rolled_back.
struct WaveNode {
    std::string cell, from, to, phase;
    int64_t gen = 0;
    int64_t since_ms = 0;
    std::string note;  // what the restarter said about its restart (e.g. more pods went with it)
    int others = 0;    // nodes restarting with it, one after another: its ready timeout is that many more
    bool operator==(const WaveNode &) const = default;
};

//! One gate's judgement, with its numbers for `status`.
struct GateReading {
    std::string signal;  // task_success, step_latency, error_codes, heartbeat, ready
    std::string code;    // error_codes: the code
    double upgraded = 0, rest = 0, before = 0, limit = 0;
    bool judged = false;  // the wave had the sample the gate needs
    bool fired = false;
    std::string note;
    bool operator==(const GateReading &) const = default;
};

struct RolloutState {
    std::string id, version;
    //! running, paused, rolling_back, halted, aborted, done
    std::string phase = "running";
    int wave = 0;   // the current wave, from 1 (0: none started)
    int waves = 0;  // the estimate of waves in all
    int64_t command_seq = 0;
    int64_t next_gen = 1;
    std::string reason;
    int64_t updated_ms = 0;
    std::map<std::string, WaveNode> wave_nodes;
    std::vector<std::string> wave_order;  // the order the wave's nodes restart in
    int64_t wave_started_ms = 0;
    int64_t settle_from_ms = 0;  // 0: the wave is not all ready yet
    //! After a rollback: "halted" (gates) or "aborted" (the operator).
    std::string after_rollback;
    //! Nodes upgraded by earlier waves, by the version they ran before (for abort --rollback).
    std::map<std::string, std::vector<std::string>> upgraded;
    std::map<std::string, std::string> upgraded_cell;  // their cells
    //! Nodes on another version whose key went while nothing restarted them (down, or cut off):
    //! the version they ran, and when they were last seen (wall ms). The rollout is not done
    //! before they are back, or gone for longer than the ready timeout.
    std::map<std::string, std::pair<std::string, int64_t>> away;
    GroupSignals before;  // the fleet over the settle-length window before the wave
    std::vector<GateReading> gates;
    std::string fired;  // the gate that halted it, with its numbers
    struct History {
        int wave = 0;
        std::vector<std::string> nodes;
        std::string verdict;
        int64_t at_ms = 0;
        bool operator==(const History &) const = default;
    };
    std::vector<History> history;  // the latest last, at most 20
    bool operator==(const RolloutState &) const = default;
};

bool rollout_active(const std::string & phase);  // running, paused, rolling_back

std::string encode_rollout_spec(const RolloutSpec & s);
std::optional<RolloutSpec> decode_rollout_spec(const std::string & text);
std::string encode_rollout_command(const RolloutCommand & c);
std::optional<RolloutCommand> decode_rollout_command(const std::string & text);
std::string encode_rollout_state(const RolloutState & s);
std::optional<RolloutState> decode_rollout_state(const std::string & text);
std::string encode_signals(const NodeSignals & s);
//! The same as JSON values, for a document that holds signals (a node's load report).
void to_json(nlohmann::json & j, const NodeSignals & s);
void from_json(const nlohmann::json & j, NodeSignals & s);
std::optional<NodeSignals> decode_signals(const std::string & text);

class Rollout {
  public:
    //! A rollout that starts, or (with `persisted` of the same id) resumes after a leader change:
    //! restarts in flight are asked for again under the same gens, and a settling wave settles
    //! again from `now_ms`.
    Rollout(RolloutSpec spec, std::optional<RolloutState> persisted, int64_t now_ms);

    //! Every live node, each turn (level-triggered). A node missing is down or restarting.
    void fleet(const std::vector<FleetNode> & live, int64_t now_ms);
    //! Applied once: a command whose seq is not above the last one applied is ignored.
    void command(const RolloutCommand & c, int64_t now_ms);
    //! The restarter could not restart `node` at `gen`: the rollout halts (gate "ready").
    void restart_failed(const std::string & node, int64_t gen, const std::string & why, int64_t now_ms);
    //! The restarter's note on `node`'s restart at `gen`, shown by `status`, and the nodes that
    //! restart with it first (it gets a ready timeout for each).
    void restart_noted(const std::string & node, int64_t gen, const std::string & note, int others = 0);
    //! The restarts in flight: every node restarting or rolling back, under its gen. The same
    //! request comes again each turn until the node is back; the restarter acts on a gen once.
    std::vector<RestartRequest> decide(int64_t now_ms);

    const RolloutState & state() const { return st_; }
    const RolloutSpec & spec() const { return spec_; }
    //! True once after each change worth persisting.
    bool take_changed();
    bool finished() const { return !rollout_active(st_.phase); }

  private:
    void start_wave(int64_t now_ms);
    void start_restarts(int64_t now_ms, const std::string & phase_from, const std::string & phase_to);
    void judge(int64_t now_ms);
    void halt(const std::string & why, const std::string & after, int64_t now_ms);
    void finish_wave(int64_t now_ms);
    bool take_token(int64_t now_ms);
    void change() { changed_ = true; }

    RolloutSpec spec_;
    RolloutState st_;
    bool changed_ = true;
    std::map<std::string, FleetNode> live_;
    std::map<std::string, NodeSignals> last_;  // each node's counters at the last turn
    int64_t last_turn_ms_ = 0;
    //! The fleet's per-turn sums over the last `settle_ms` (what `before` is frozen from).
    std::deque<std::pair<int64_t, GroupSignals>> window_;
    GroupSignals wave_sig_, rest_sig_;  // since the wave's settle started
    double tokens_ = -1;
    int64_t tokens_at_ms_ = 0;
    int64_t born_ms_ = 0;  // when this brain took the rollout on
    //! Wave nodes held back by another node of their cell that drains outside the wave, since when.
    std::map<std::string, int64_t> blocked_since_;
    //! Pods on the old version that drain and hold the pods of their set below them, since when.
    std::map<std::string, int64_t> drain_held_since_;
};

}  // namespace armada::cluster

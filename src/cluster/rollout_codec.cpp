// A rollout's records as etcd keeps them (its spec, the operator's commands, its state, the
// nodes' signals), and the sum of signals over a group of nodes. The rollout itself is in
// rollout.cpp.

#include "cluster/rollout.h"

#include <nlohmann/json.hpp>

namespace armada::cluster {

using json = nlohmann::json;

// --- JSON (the etcd values; unknown fields are ignored, missing ones take their defaults) ---

void to_json(json & j, const NodeSignals & s) {
    j = json{{"started_ms", s.started_ms}, {"steps", s.steps},
             {"step_s", s.step_s},         {"completed", s.completed},
             {"failed", s.failed},         {"errors", s.errors},
             {"renew_late", s.renew_late}, {"renew_failed", s.renew_failed},
             {"lease_lost", s.lease_lost}};
}
void from_json(const json & j, NodeSignals & s) {
    s.started_ms = j.value("started_ms", int64_t(0));
    s.steps = j.value("steps", int64_t(0));
    s.step_s = j.value("step_s", 0.0);
    s.completed = j.value("completed", int64_t(0));
    s.failed = j.value("failed", int64_t(0));
    if (j.contains("errors")) s.errors = j.at("errors").get<std::map<std::string, int64_t>>();
    s.renew_late = j.value("renew_late", int64_t(0));
    s.renew_failed = j.value("renew_failed", int64_t(0));
    s.lease_lost = j.value("lease_lost", int64_t(0));
}
void to_json(json & j, const GroupSignals & s) {
    j = json{{"node_minutes", s.node_minutes}, {"steps", s.steps},   {"step_s", s.step_s},
             {"completed", s.completed},       {"failed", s.failed}, {"errors", s.errors},
             {"heartbeat", s.heartbeat}};
}
void from_json(const json & j, GroupSignals & s) {
    s.node_minutes = j.value("node_minutes", 0.0);
    s.steps = j.value("steps", int64_t(0));
    s.step_s = j.value("step_s", 0.0);
    s.completed = j.value("completed", int64_t(0));
    s.failed = j.value("failed", int64_t(0));
    if (j.contains("errors")) s.errors = j.at("errors").get<std::map<std::string, int64_t>>();
    s.heartbeat = j.value("heartbeat", int64_t(0));
}
void to_json(json & j, const RolloutGates & g) {
    j = json{{"success_drop", g.success_drop},         {"min_sessions", g.min_sessions},
             {"latency_ratio", g.latency_ratio},       {"min_steps", g.min_steps},
             {"error_ratio", g.error_ratio},           {"error_floor", g.error_floor},
             {"heartbeat_excess", g.heartbeat_excess}, {"min_node_minutes", g.min_node_minutes}};
}
void from_json(const json & j, RolloutGates & g) {
    const RolloutGates d;
    g.success_drop = j.value("success_drop", d.success_drop);
    g.min_sessions = j.value("min_sessions", d.min_sessions);
    g.latency_ratio = j.value("latency_ratio", d.latency_ratio);
    g.min_steps = j.value("min_steps", d.min_steps);
    g.error_ratio = j.value("error_ratio", d.error_ratio);
    g.error_floor = j.value("error_floor", d.error_floor);
    g.heartbeat_excess = j.value("heartbeat_excess", d.heartbeat_excess);
    g.min_node_minutes = j.value("min_node_minutes", d.min_node_minutes);
}
void to_json(json & j, const WaveNode & w) {
    j = json{{"cell", w.cell}, {"from", w.from},         {"to", w.to},     {"phase", w.phase},
             {"gen", w.gen},   {"since_ms", w.since_ms}, {"note", w.note}, {"others", w.others}};
}
void from_json(const json & j, WaveNode & w) {
    w.cell = j.value("cell", "");
    w.from = j.value("from", "");
    w.to = j.value("to", "");
    w.phase = j.value("phase", "");
    w.gen = j.value("gen", int64_t(0));
    w.since_ms = j.value("since_ms", int64_t(0));
    w.note = j.value("note", "");
    w.others = j.value("others", 0);
}
void to_json(json & j, const GateReading & g) {
    j = json{{"signal", g.signal}, {"code", g.code},     {"upgraded", g.upgraded},
             {"rest", g.rest},     {"before", g.before}, {"limit", g.limit},
             {"judged", g.judged}, {"fired", g.fired},   {"note", g.note}};
}
void from_json(const json & j, GateReading & g) {
    g.signal = j.value("signal", "");
    g.code = j.value("code", "");
    g.upgraded = j.value("upgraded", 0.0);
    g.rest = j.value("rest", 0.0);
    g.before = j.value("before", 0.0);
    g.limit = j.value("limit", 0.0);
    g.judged = j.value("judged", false);
    g.fired = j.value("fired", false);
    g.note = j.value("note", "");
}

bool rollout_active(const std::string & phase) {
    return phase == "running" || phase == "paused" || phase == "rolling_back";
}

std::string encode_rollout_spec(const RolloutSpec & s) {
    return json{{"id", s.id},
                {"version", s.version},
                {"wave_percent", s.wave_percent},
                {"max_per_cell", s.max_per_cell},
                {"settle_ms", s.settle_ms},
                {"ready_timeout_ms", s.ready_timeout_ms},
                {"restarts_per_s", s.restarts_per_s},
                {"ordinal_desc", s.ordinal_desc},
                {"before_ms", s.before_ms},
                {"gates", s.gates},
                {"at_ms", s.at_ms}}
        .dump();
}

std::optional<RolloutSpec> decode_rollout_spec(const std::string & text) {
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    RolloutSpec s;
    try {
        s.id = j.value("id", "");
        s.version = j.value("version", "");
        s.wave_percent = j.value("wave_percent", s.wave_percent);
        s.max_per_cell = j.value("max_per_cell", s.max_per_cell);
        s.settle_ms = j.value("settle_ms", s.settle_ms);
        s.ready_timeout_ms = j.value("ready_timeout_ms", s.ready_timeout_ms);
        s.restarts_per_s = j.value("restarts_per_s", s.restarts_per_s);
        s.ordinal_desc = j.value("ordinal_desc", false);
        s.before_ms = j.value("before_ms", int64_t(0));
        if (j.contains("gates")) s.gates = j.at("gates").get<RolloutGates>();
        s.at_ms = j.value("at_ms", int64_t(0));
    } catch (const json::exception &) {
        return std::nullopt;
    }
    if (s.id.empty() || s.version.empty() || !(s.wave_percent > 0) || s.max_per_cell < 1 || !(s.restarts_per_s > 0))
        return std::nullopt;
    return s;
}

std::string encode_rollout_command(const RolloutCommand & c) {
    return json{{"id", c.id}, {"seq", c.seq}, {"op", c.op}, {"rollback", c.rollback}}.dump();
}

std::optional<RolloutCommand> decode_rollout_command(const std::string & text) {
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    RolloutCommand c;
    try {
        c.id = j.value("id", "");
        c.seq = j.value("seq", int64_t(0));
        c.op = j.value("op", "");
        c.rollback = j.value("rollback", false);
    } catch (const json::exception &) {
        return std::nullopt;
    }
    if (c.op != "pause" && c.op != "resume" && c.op != "abort") return std::nullopt;
    return c;
}

std::string encode_rollout_state(const RolloutState & s) {
    json hist = json::array();
    for (const auto & h : s.history)
        hist.push_back({{"wave", h.wave}, {"nodes", h.nodes}, {"verdict", h.verdict}, {"at_ms", h.at_ms}});
    return json{{"id", s.id},
                {"version", s.version},
                {"phase", s.phase},
                {"wave", s.wave},
                {"waves", s.waves},
                {"command_seq", s.command_seq},
                {"next_gen", s.next_gen},
                {"reason", s.reason},
                {"updated_ms", s.updated_ms},
                {"wave_nodes", s.wave_nodes},
                {"wave_order", s.wave_order},
                {"wave_started_ms", s.wave_started_ms},
                {"settle_from_ms", s.settle_from_ms},
                {"after_rollback", s.after_rollback},
                {"upgraded", s.upgraded},
                {"upgraded_cell", s.upgraded_cell},
                {"away", s.away},
                {"before", s.before},
                {"gates", s.gates},
                {"fired", s.fired},
                {"history", hist}}
        .dump();
}

std::optional<RolloutState> decode_rollout_state(const std::string & text) {
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    RolloutState s;
    try {
        s.id = j.value("id", "");
        s.version = j.value("version", "");
        s.phase = j.value("phase", "");
        s.wave = j.value("wave", 0);
        s.waves = j.value("waves", 0);
        s.command_seq = j.value("command_seq", int64_t(0));
        s.next_gen = j.value("next_gen", int64_t(1));
        s.reason = j.value("reason", "");
        s.updated_ms = j.value("updated_ms", int64_t(0));
        if (j.contains("wave_nodes")) s.wave_nodes = j.at("wave_nodes").get<std::map<std::string, WaveNode>>();
        if (j.contains("wave_order")) s.wave_order = j.at("wave_order").get<std::vector<std::string>>();
        s.wave_started_ms = j.value("wave_started_ms", int64_t(0));
        s.settle_from_ms = j.value("settle_from_ms", int64_t(0));
        s.after_rollback = j.value("after_rollback", "");
        if (j.contains("upgraded"))
            s.upgraded = j.at("upgraded").get<std::map<std::string, std::vector<std::string>>>();
        if (j.contains("upgraded_cell"))
            s.upgraded_cell = j.at("upgraded_cell").get<std::map<std::string, std::string>>();
        if (j.contains("away")) s.away = j.at("away").get<std::map<std::string, std::pair<std::string, int64_t>>>();
        if (j.contains("before")) s.before = j.at("before").get<GroupSignals>();
        if (j.contains("gates")) s.gates = j.at("gates").get<std::vector<GateReading>>();
        s.fired = j.value("fired", "");
        if (j.contains("history")) {
            for (const auto & h : j.at("history")) {
                s.history.push_back({h.value("wave", 0), h.value("nodes", std::vector<std::string>{}),
                                     h.value("verdict", ""), h.value("at_ms", int64_t(0))});
            }
        }
    } catch (const json::exception &) {
        return std::nullopt;
    }
    if (s.id.empty() || s.phase.empty()) return std::nullopt;
    // Every node the wave names must be in it, or `decide` would skip it forever.
    for (const auto & n : s.wave_order)
        if (!s.wave_nodes.count(n)) return std::nullopt;
    return s;
}

std::string encode_signals(const NodeSignals & s) {
    return json(s).dump();
}

std::optional<NodeSignals> decode_signals(const std::string & text) {
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    try {
        return j.get<NodeSignals>();
    } catch (const json::exception &) {
        return std::nullopt;
    }
}

void GroupSignals::add(const GroupSignals & o) {
    node_minutes += o.node_minutes;
    steps += o.steps;
    step_s += o.step_s;
    completed += o.completed;
    failed += o.failed;
    for (const auto & [code, n] : o.errors)
        errors[code] += n;
    heartbeat += o.heartbeat;
}

}  // namespace armada::cluster

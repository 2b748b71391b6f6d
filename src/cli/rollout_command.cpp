#include "cli/rollout_command.h"

#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/membership.h"
#include "cluster/restarter.h"
#include "cluster/rollout.h"
#include "common/cli_exit.h"
#include "common/clock.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>

namespace armada::cli {

using common::fail;

namespace {

using json = nlohmann::json;
using namespace cluster;

//! What etcd holds about rollouts, with each key's revision (0: absent).
struct Keys {
    std::optional<RolloutSpec> spec;
    std::optional<RolloutState> state;
    std::optional<RolloutCommand> command;
    int64_t spec_rev = 0, state_rev = 0, command_rev = 0;
    std::map<std::string, RestartAck> acks;
    //! The state, when it is this spec's.
    const RolloutState * current() const { return spec && state && state->id == spec->id ? &*state : nullptr; }
    //! A rollout under way: its state says so, or no brain has written one yet.
    bool active() const { return spec && (!current() || rollout_active(current()->phase)); }
};

std::string read_keys(EtcdClient & etcd, const ClusterConfig & cfg, Keys & k) {
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    if (auto e = etcd.list(rollout_prefix(cfg), kvs, rev); !e.empty()) return e;
    const ClusterKeys keys(cfg.prefix);
    using Kind = ClusterKeys::Parsed::Kind;
    for (const auto & kv : kvs) {
        const auto p = keys.parse(kv.key);
        if (p.kind == Kind::RolloutSpec) {
            k.spec = decode_rollout_spec(kv.value);
            k.spec_rev = kv.mod_revision;
        } else if (p.kind == Kind::RolloutState) {
            k.state = decode_rollout_state(kv.value);
            k.state_rev = kv.mod_revision;
        } else if (p.kind == Kind::RolloutCommand) {
            k.command = decode_rollout_command(kv.value);
            k.command_rev = kv.mod_revision;
        } else if (p.kind == Kind::RestartAck) {
            if (auto a = decode_restart_ack(kv.value)) k.acks[p.name] = *a;
        }
    }
    return {};
}

struct LiveNode {
    std::string cell, version;
    bool draining = false;
};

std::map<std::string, LiveNode> live_nodes(EtcdClient & etcd, const ClusterConfig & cfg, std::string & err) {
    std::map<std::string, LiveNode> out;
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    const ClusterKeys keys(cfg.prefix);
    if (err = etcd.list(keys.cells(), kvs, rev); !err.empty()) return out;
    for (const auto & kv : kvs) {
        const auto k = keys.parse(kv.key);
        if (k.kind != ClusterKeys::Parsed::Kind::Node) continue;
        if (auto l = decode_load(k.name, kv.value)) out[k.name] = {k.cell, l->version, l->draining};
    }
    return out;
}

std::string fmt(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", v);
    return b;
}

}  // namespace

RolloutSpec rollout_spec(const RolloutOptions & o, const RolloutDefaults & d, int64_t now_ms) {
    auto pick = [&](const char * flag, auto flag_value, auto file_value) {
        return o.given.count(flag) ? flag_value : file_value;
    };
    RolloutSpec s;
    s.at_ms = now_ms;
    s.id = "r-" + std::to_string(s.at_ms);
    s.version = o.version;
    s.wave_percent = pick("--wave-percent", o.wave_percent, d.wave_percent);
    s.max_per_cell = pick("--max-per-cell", o.max_per_cell, d.max_per_cell);
    s.settle_ms = int64_t(pick("--settle", o.settle_s, d.settle_s)) * 1000;
    const int before_s = pick("--watch-before", o.watch_before_s, d.watch_before_s);
    s.before_ms = before_s >= 0 ? int64_t(before_s) * 1000 : std::min<int64_t>(s.settle_ms, 60000);
    s.ready_timeout_ms = int64_t(pick("--ready-timeout", o.ready_timeout_s, d.ready_timeout_s)) * 1000;
    s.restarts_per_s = pick("--restarts-per-s", o.restarts_per_s, d.restarts_per_s);
    s.gates = d.gates;
    s.gates.min_sessions = pick("--gate-min-sessions", o.gate_min_sessions, d.gates.min_sessions);
    s.gates.min_steps = pick("--gate-min-steps", o.gate_min_steps, d.gates.min_steps);
    s.gates.latency_ratio = pick("--gate-latency-ratio", o.gate_latency_ratio, d.gates.latency_ratio);
    s.gates.error_ratio = pick("--gate-error-ratio", o.gate_error_ratio, d.gates.error_ratio);
    s.gates.error_floor = pick("--gate-error-floor", o.gate_error_floor, d.gates.error_floor);
    s.gates.success_drop = pick("--gate-success-drop", o.gate_success_drop, d.gates.success_drop);
    s.gates.heartbeat_excess = pick("--gate-heartbeat-excess", o.gate_heartbeat_excess, d.gates.heartbeat_excess);
    return s;
}

namespace {

int start(EtcdClient & etcd, const ClusterConfig & cfg, const RolloutOptions & o) {
    if (o.version.empty()) return fail("rollout start needs --version");
    Keys k;
    if (auto e = read_keys(etcd, cfg, k); !e.empty()) return fail("cannot read etcd: " + e);
    if (k.active()) {
        const auto * st = k.current();
        return fail("rollout " + k.spec->id + " to " + k.spec->version + " is " + (st ? st->phase : "starting") +
                    "; pause, resume or abort it (armada rollout abort) before starting another");
    }
    const RolloutSpec s = rollout_spec(o, cfg.rollout, common::wall_ms());
    bool ok = false;
    int64_t rev = 0;
    const std::string prefix = rollout_prefix(cfg);
    // Only over what was read: two operators cannot start rollouts over each other.
    const std::vector<EtcdCompare> cmp{{EtcdCompare::Target::Mod, prefix + "spec", k.spec_rev},
                                       {EtcdCompare::Target::Mod, prefix + "state", k.state_rev}};
    if (auto e = etcd.txn(cmp, {{prefix + "spec", encode_rollout_spec(s)}}, ok, rev); !e.empty())
        return fail("cannot write the rollout to etcd: " + e);
    if (!ok) return fail("another rollout was started or changed meanwhile; see armada rollout status");
    printf(
        "rollout %s started: every node to %s, in waves of %s%% of the fleet, at most %d node%s of a cell at "
        "a time; the leading global brain runs it (armada rollout status)\n",
        s.id.c_str(), s.version.c_str(), fmt(s.wave_percent).c_str(), s.max_per_cell, s.max_per_cell == 1 ? "" : "s");
    return 0;
}

int command(EtcdClient & etcd, const ClusterConfig & cfg, const RolloutOptions & o) {
    Keys k;
    if (auto e = read_keys(etcd, cfg, k); !e.empty()) return fail("cannot read etcd: " + e);
    if (!k.spec) return fail("no rollout has been started");
    if (!k.active())
        return fail("rollout " + k.spec->id + " is " + k.current()->phase + ": there is nothing to " + o.action);
    const auto * st = k.current();
    if (o.action == "resume" && (!st || st->phase != "paused"))
        return fail("rollout " + k.spec->id + " is " + (st ? st->phase : "starting") + ", not paused");
    RolloutCommand c;
    c.id = k.spec->id;
    c.op = o.action;
    c.rollback = o.rollback;
    c.seq = std::max(st ? st->command_seq : 0, k.command && k.command->id == c.id ? k.command->seq : 0) + 1;
    bool ok = false;
    int64_t rev = 0;
    const std::string key = rollout_prefix(cfg) + "command";
    if (auto e =
            etcd.txn({{EtcdCompare::Target::Mod, key, k.command_rev}}, {{key, encode_rollout_command(c)}}, ok, rev);
        !e.empty())
        return fail("cannot write the command to etcd: " + e);
    if (!ok) return fail("another command was given meanwhile; see armada rollout status");
    printf("rollout %s: %s%s asked; the leading global brain carries it out\n", c.id.c_str(), c.op.c_str(),
           c.rollback ? " with rollback" : "");
    return 0;
}

int status(EtcdClient & etcd, const ClusterConfig & cfg, const RolloutOptions & o) {
    Keys k;
    if (auto e = read_keys(etcd, cfg, k); !e.empty()) return fail("cannot read etcd: " + e);
    std::string err;
    const auto nodes = live_nodes(etcd, cfg, err);
    if (!err.empty()) return fail("cannot read the nodes from etcd: " + err);
    const auto * st = k.current();
    const int64_t age_ms = st ? common::wall_ms() - st->updated_ms : 0;
    const bool stale = st && rollout_active(st->phase) && age_ms > 10000;
    if (o.json) {
        json ns = json::array();
        for (const auto & [name, n] : nodes)
            ns.push_back({{"name", name}, {"cell", n.cell}, {"version", n.version}, {"draining", n.draining}});
        json acks = json::object();
        for (const auto & [name, a] : k.acks)
            acks[name] = json::parse(encode_restart_ack(a));
        printf("%s\n", json{{"spec", k.spec ? json::parse(encode_rollout_spec(*k.spec)) : json(nullptr)},
                            {"state", st ? json::parse(encode_rollout_state(*st)) : json(nullptr)},
                            {"nodes", ns},
                            {"acks", acks},
                            {"stale", stale}}
                           .dump()
                           .c_str());
        return 0;
    }
    if (!k.spec) {
        printf("no rollout has been started\n");
        return 0;
    }
    int on = 0;
    for (const auto & [name, n] : nodes)
        on += n.version == k.spec->version;
    if (!st) {
        printf(
            "rollout %s to %s: started, no global brain has picked it up yet (is one running with "
            "--restarter?)\n",
            k.spec->id.c_str(), k.spec->version.c_str());
        return 0;
    }
    printf("rollout %s to %s: %s, wave %d of %d, %d of %zu live nodes on %s\n", st->id.c_str(), st->version.c_str(),
           st->phase.c_str(), st->wave, std::max(st->waves, st->wave), on, nodes.size(), st->version.c_str());
    if (!st->reason.empty()) printf("  %s\n", st->reason.c_str());
    if (stale)
        printf("  warning: the state was last written %lld s ago; does a global brain lead?\n",
               (long long)(age_ms / 1000));
    for (const auto & name : st->wave_order) {
        const auto & w = st->wave_nodes.at(name);
        printf("  %-24s %-10s %s -> %s  %s (%lld s)\n", name.c_str(), w.cell.c_str(), w.from.c_str(), w.to.c_str(),
               w.phase.c_str(), (long long)((common::wall_ms() - w.since_ms) / 1000));
        if (!w.note.empty()) printf("    %s\n", w.note.c_str());
    }
    for (const auto & g : st->gates) {
        std::string what = g.signal + (g.code.empty() ? "" : " (" + g.code + ")");
        printf("  gate %-22s %s  wave %s, rest %s, before %s, limit %s%s%s\n", what.c_str(),
               g.fired ? "FIRED" : (g.judged ? "ok   " : "wait "), fmt(g.upgraded).c_str(), fmt(g.rest).c_str(),
               fmt(g.before).c_str(), fmt(g.limit).c_str(), g.note.empty() ? "" : "; ", g.note.c_str());
    }
    if (!st->fired.empty()) printf("  halted: %s\n", st->fired.c_str());
    return 0;
}

}  // namespace

int rollout_command(const RolloutOptions & o) {
    std::string err;
    auto cfg = load_cluster_config_for_service(o.cluster_file, err);
    if (!cfg) return fail(err);
    EtcdClient etcd = make_etcd(*cfg);
    if (o.action == "start") return start(etcd, *cfg, o);
    if (o.action == "status") return status(etcd, *cfg, o);
    return command(etcd, *cfg, o);
}

}  // namespace armada::cli

#include "sim/scenario.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string_view>

namespace armada::sim {

namespace {

//! Reads the keys of a YAML map, refusing any not in `known`: a typo must not go unnoticed.
struct MapReader {
    const YAML::Node & n;
    std::string where;
    std::string & error;

    bool check(std::initializer_list<std::string_view> known) {
        if (!n.IsMap()) {
            error = where + ": must be a map";
            return false;
        }
        for (const auto & kv : n) {
            const std::string k = kv.first.as<std::string>();
            if (std::find(known.begin(), known.end(), k) == known.end()) {
                error = where + ": unknown setting '" + k + "'";
                return false;
            }
        }
        return true;
    }
    //! Sets `out` from key `k` if present, within [lo, hi]; false (with `error`) otherwise.
    template <class T>
    bool get(const char * k, T & out, double lo, double hi) {
        if (!n[k]) return true;
        const T v = n[k].as<T>();
        if (!(double(v) >= lo && double(v) <= hi)) {
            error = where + "." + k + ": must be between " + std::to_string(lo) + " and " + std::to_string(hi);
            return false;
        }
        out = v;
        return true;
    }
};

std::optional<Fault::Kind> fault_kind(const std::string & s) {
    if (s == "node_crash") return Fault::Kind::NodeCrash;
    if (s == "node_hang") return Fault::Kind::NodeHang;
    if (s == "cell_lost") return Fault::Kind::CellLost;
    if (s == "brain_crash") return Fault::Kind::BrainCrash;
    if (s == "etcd_restart") return Fault::Kind::EtcdRestart;
    if (s == "restart_storm") return Fault::Kind::RestartStorm;
    if (s == "partition") return Fault::Kind::Partition;
    if (s == "slow_disk") return Fault::Kind::SlowDisk;
    if (s == "nats_outage") return Fault::Kind::NatsOutage;
    if (s == "pg_outage") return Fault::Kind::PgOutage;
    if (s == "nats_partition") return Fault::Kind::NatsPartition;
    return std::nullopt;
}

}  // namespace

std::optional<Scenario> parse_scenario(const std::string & text, std::string & error) {
    error.clear();
    Scenario s;
    try {
        const YAML::Node root = YAML::Load(text);
        MapReader r{root, "scenario", error};
        if (!r.check({"name",      "cells",        "nodes_per_cell", "water",      "domains",
                      "node",      "tenants",      "faults",         "duration_s", "lease_ttl_ms",
                      "report_ms", "cell_tick_ms", "global_tick_ms", "shares_ms",  "reconcile_ms",
                      "commit_ms", "nats_ms",      "watch_ms",       "buggify",    "rollout"}))
            return std::nullopt;
        if (root["name"]) s.name = root["name"].as<std::string>();
        if (!r.get("cells", s.cells, 1, 1024) || !r.get("nodes_per_cell", s.nodes_per_cell, 1, 1024) ||
            !r.get("water", s.water, 0.01, 1) || !r.get("domains", s.domains, 0, 1024) ||
            !r.get("duration_s", s.duration_s, 1, 86400) || !r.get("lease_ttl_ms", s.lease_ttl_ms, 100, 600000) ||
            !r.get("report_ms", s.report_ms, 10, 600000) || !r.get("cell_tick_ms", s.cell_tick_ms, 1, 60000) ||
            !r.get("global_tick_ms", s.global_tick_ms, 1, 600000) || !r.get("shares_ms", s.shares_ms, 1, 3600000) ||
            !r.get("reconcile_ms", s.reconcile_ms, 100, 3600000) || !r.get("commit_ms", s.commit_ms, 0, 60000) ||
            !r.get("nats_ms", s.nats_ms, 0, 60000) || !r.get("watch_ms", s.watch_ms, 0, 60000))
            return std::nullopt;
        if (root["buggify"]) s.buggify = root["buggify"].as<bool>();
        if (const YAML::Node n = root["node"]) {
            MapReader nr{n, "node", error};
            if (!nr.check({"sessions", "tokens_per_s", "seq_tokens_per_s", "step_tokens", "restore_ms", "cores",
                           "prefill_tokens_per_s", "step_prompt_tokens", "decode_curve", "kv_budget_mb",
                           "kv_base_tokens", "kv_step_tokens", "kv_bytes_per_token"}) ||
                !nr.get("kv_budget_mb", s.node.kv_budget_mb, 0, 1e9) ||
                !nr.get("kv_base_tokens", s.node.kv_base_tokens, 0, 10000000) ||
                !nr.get("kv_step_tokens", s.node.kv_step_tokens, 0, 10000000) ||
                !nr.get("kv_bytes_per_token", s.node.kv_bytes_per_token, 1, 100000000) ||
                !nr.get("prefill_tokens_per_s", s.node.prefill_tokens_per_s, 0, 1e8) ||
                !nr.get("step_prompt_tokens", s.node.step_prompt_tokens, 0, 1000000) ||
                !nr.get("sessions", s.node.sessions, 1, 100000) ||
                !nr.get("tokens_per_s", s.node.tokens_per_s, 0.01, 1e7) ||
                !nr.get("seq_tokens_per_s", s.node.seq_tokens_per_s, 0.01, 1e6) ||
                !nr.get("step_tokens", s.node.step_tokens, 1, 100000) ||
                !nr.get("restore_ms", s.node.restore_ms, 0, 600000) || !nr.get("cores", s.node.cores, 1, 4096))
                return std::nullopt;
            if (const YAML::Node c = n["decode_curve"]) {
                // [[sequences, tokens/s], ...], sequences ascending from 1.
                bool ok = c.IsSequence() && c.size() > 0 && c.size() <= 64;
                for (size_t i = 0; ok && i < c.size(); ++i) {
                    ok = c[i].IsSequence() && c[i].size() == 2;
                    if (!ok) break;
                    const double b = c[i][0].as<double>(), t = c[i][1].as<double>();
                    ok = b >= 1 && b <= 1e6 && t > 0 && t <= 1e8 &&
                         (s.node.decode_curve.empty() || b > s.node.decode_curve.back().first);
                    if (ok) s.node.decode_curve.emplace_back(b, t);
                }
                if (!ok) {
                    error =
                        "node.decode_curve: must be a list of [sequences, tokens_per_s] pairs, sequences "
                        "ascending from 1, tokens_per_s above 0";
                    return std::nullopt;
                }
            }
        }
        if (const YAML::Node n = root["rollout"]) {
            MapReader rr{n, "rollout", error};
            RolloutPlan & p = s.rollout;
            p.on = true;
            if (!rr.check({"at_s", "wave_percent", "max_per_cell", "settle_s", "restarts_per_s", "restart_s",
                           "jitter_s", "drain_timeout_s", "bad"}) ||
                !rr.get("at_s", p.at_s, 0, 86400) || !rr.get("wave_percent", p.wave_percent, 0.01, 100) ||
                !rr.get("max_per_cell", p.max_per_cell, 1, 1024) || !rr.get("settle_s", p.settle_s, 0, 86400) ||
                !rr.get("restarts_per_s", p.restarts_per_s, 0.01, 100000) ||
                !rr.get("restart_s", p.restart_s, 0, 3600) || !rr.get("jitter_s", p.jitter_s, 0, 3600) ||
                !rr.get("drain_timeout_s", p.drain_timeout_s, 0, 86400))
                return std::nullopt;
            if (n["bad"]) p.bad = n["bad"].as<bool>();
        }
        if (const YAML::Node ts = root["tenants"]) {
            if (!ts.IsSequence()) {
                error = "tenants: must be a list";
                return std::nullopt;
            }
            for (size_t i = 0; i < ts.size(); ++i) {
                TenantLoad t;
                t.name = "t" + std::to_string(i);
                MapReader tr{ts[i], "tenants[" + std::to_string(i) + "]", error};
                if (!tr.check({"name", "rate_per_s", "steps", "tool_ms", "tool_dist", "think_ms", "initial",
                               "concurrency", "sessions"}) ||
                    !tr.get("concurrency", t.concurrency, 0, 10000000) ||
                    !tr.get("sessions", t.sessions, 0, 100000000) || !tr.get("rate_per_s", t.rate_per_s, 0, 1e6) ||
                    !tr.get("steps", t.steps, 1, 10000) || !tr.get("tool_ms", t.tool_ms, 0, 3600000) ||
                    !tr.get("think_ms", t.think_ms, 0, 3600000) || !tr.get("initial", t.initial, 0, 10000000))
                    return std::nullopt;
                if (ts[i]["name"]) t.name = ts[i]["name"].as<std::string>();
                if (ts[i]["tool_dist"]) t.tool_dist = ts[i]["tool_dist"].as<std::string>();
                if (t.tool_dist != "exponential" && t.tool_dist != "uniform" && t.tool_dist != "constant") {
                    error = "tenants[" + std::to_string(i) + "].tool_dist: must be exponential, uniform or constant";
                    return std::nullopt;
                }
                if (t.concurrency > 0 && !ts[i]["rate_per_s"]) t.rate_per_s = 0;
                if (t.concurrency > 0 && t.rate_per_s > 0) {
                    error = "tenants[" + std::to_string(i) +
                            "]: concurrency (a closed loop) and rate_per_s exclude each other";
                    return std::nullopt;
                }
                s.tenants.push_back(t);
            }
        }
        if (const YAML::Node fs = root["faults"]) {
            if (!fs.IsSequence()) {
                error = "faults: must be a list";
                return std::nullopt;
            }
            for (size_t i = 0; i < fs.size(); ++i) {
                Fault f;
                const std::string where = "faults[" + std::to_string(i) + "]";
                MapReader fr{fs[i], where, error};
                if (!fr.check({"kind", "at_s", "cell", "node", "for_s", "jitter", "ms"})) return std::nullopt;
                const auto k = fault_kind(fs[i]["kind"] ? fs[i]["kind"].as<std::string>() : "");
                if (!k) {
                    error = where +
                            ".kind: must be node_crash, node_hang, cell_lost, brain_crash, etcd_restart, "
                            "restart_storm, partition, slow_disk, nats_outage, pg_outage or nats_partition";
                    return std::nullopt;
                }
                f.kind = *k;
                if (!fr.get("at_s", f.at_s, 0, 86400) || !fr.get("cell", f.cell, 0, s.cells - 1) ||
                    !fr.get("node", f.node, 0, s.nodes_per_cell - 1) || !fr.get("for_s", f.for_s, 0, 86400) ||
                    !fr.get("ms", f.ms, 0, 600000))
                    return std::nullopt;
                if (fs[i]["jitter"]) f.jitter = fs[i]["jitter"].as<bool>();
                if ((f.kind == Fault::Kind::NatsOutage || f.kind == Fault::Kind::PgOutage ||
                     f.kind == Fault::Kind::NatsPartition) &&
                    f.for_s <= 0) {
                    error = where + ".for_s: an outage needs a length in seconds (more than 0)";
                    return std::nullopt;
                }
                s.faults.push_back(f);
            }
        }
    } catch (const YAML::Exception & e) {
        error = std::string("not a valid scenario: ") + e.what();
        return std::nullopt;
    }
    if (s.tenants.empty()) {
        error = "tenants: at least one is needed";
        return std::nullopt;
    }
    return s;
}

}  // namespace armada::sim

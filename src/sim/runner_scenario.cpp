// A runner scenario from its YAML file (sim/runners-*.yaml): the world's size, its load and its
// faults. The world that runs it is in runners.cpp.

#include "sim/runners.h"

#include <yaml-cpp/yaml.h>

namespace armada::sim {

std::optional<RunnerScenario> parse_runner_scenario(const std::string & yaml, std::string & error) {
    YAML::Node n;
    try {
        n = YAML::Load(yaml);
    } catch (const std::exception & e) {
        error = std::string("not YAML: ") + e.what();
        return std::nullopt;
    }
    if (!n.IsMap()) {
        error = "a runner scenario is a map";
        return std::nullopt;
    }
    RunnerScenario s;
    try {
        for (const auto & kv : n) {
            const std::string k = kv.first.as<std::string>();
            const YAML::Node & v = kv.second;
            const auto integer = [&](int & out, int lo, int hi) {
                const int x = v.as<int>();
                if (x < lo || x > hi) {
                    error = k + ": must be between " + std::to_string(lo) + " and " + std::to_string(hi);
                    return false;
                }
                out = x;
                return true;
            };
            const auto real = [&](double & out, double lo, double hi) {
                const double x = v.as<double>();
                if (!(x >= lo && x <= hi)) {
                    error = k + ": must be between " + std::to_string(lo) + " and " + std::to_string(hi);
                    return false;
                }
                out = x;
                return true;
            };
            bool ok = true;
            if (k == "world") {
                if (v.as<std::string>() != "runners") {
                    error = "world: only 'runners' is read here";
                    ok = false;
                }
            } else if (k == "name") {
                s.name = v.as<std::string>();
            } else if (k == "cells") {
                ok = integer(s.cells, 1, 256);
            } else if (k == "nodes_per_cell") {
                ok = integer(s.nodes_per_cell, 1, 1024);
            } else if (k == "brains_per_cell") {
                ok = integer(s.brains_per_cell, 1, 5);
            } else if (k == "globals") {
                ok = integer(s.globals, 1, 5);
            } else if (k == "sessions") {
                ok = integer(s.sessions, 0, 10'000'000);
            } else if (k == "steps") {
                ok = integer(s.steps, 1, 1000);
            } else if (k == "step_ms") {
                ok = integer(s.step_ms, 1, 3'600'000);
            } else if (k == "capacity") {
                ok = integer(s.capacity, 1, 100'000);
            } else if (k == "lease_ttl_ms") {
                ok = integer(s.lease_ttl_ms, 1000, 60'000);
            } else if (k == "reconcile_ms") {
                ok = integer(s.reconcile_ms, 100, 3'600'000);
            } else if (k == "tick_ms") {
                ok = integer(s.tick_ms, 10, 1000);
            } else if (k == "fault_s") {
                ok = real(s.fault_s, 0, 86400);
            } else if (k == "arrive_s") {
                ok = real(s.arrive_s, 0, 86400);
            } else if (k == "duration_s") {
                ok = real(s.duration_s, 1, 86400);
            } else if (k == "faults_per_s") {
                ok = real(s.faults_per_s, 0, 100);
            } else if (k == "faults") {
                s.faults = v.as<bool>();
            } else if (k == "complete") {
                s.complete = v.as<bool>();
            } else {
                error = "unknown setting '" + k + "'";
                ok = false;
            }
            if (!ok) return std::nullopt;
        }
    } catch (const YAML::Exception & e) {
        error = e.what();
        return std::nullopt;
    }
    if (s.lease_ttl_ms < 3 * s.tick_ms) {
        error = "lease_ttl_ms must be at least three ticks";
        return std::nullopt;
    }
    return s;
}

}  // namespace armada::sim

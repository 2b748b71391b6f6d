// What `armada serve` makes of some of its flags: a duration (--session-ttl), the engines'
// placement on the machine's cores (--cpus, --numa-nodes, --engines), and `armada topology`,
// which prints that placement without serving.

#include "cli/serve.h"
#include "common/cli_exit.h"
#include "engine/topology.h"

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace armada::cli {

std::optional<engine::PlacementOptions> placement_options(const PlacementFlags & f, std::string & err) {
    engine::PlacementOptions po;
    po.numa = f.numa;
    po.smt = f.smt;
    po.engines = f.engines;
    // Both flags take a Linux list ("0-3,8"); empty means no restriction.
    auto list = [&](const std::string & text, const char * flag, const char * example, std::vector<int> & out) {
        if (text.empty()) return true;
        auto l = engine::parse_cpu_list(text);
        if (!l) err = std::string(flag) + ": '" + text + "' is not " + example;
        if (l) out = *l;
        return bool(l);
    };
    if (!list(f.cpus, "--cpus", "a cpu list such as 0-15,32-47", po.cpus) ||
        !list(f.numa_nodes, "--numa-nodes", "a list such as 0,1 or 0-3", po.numa_nodes))
        return std::nullopt;
    return po;
}

std::optional<int64_t> parse_duration_ms(const std::string & text) {
    if (text.empty()) return std::nullopt;
    size_t used = 0;
    double v = 0;
    try {
        v = std::stod(text, &used);
    } catch (const std::exception &) {
        return std::nullopt;
    }
    const std::string unit = text.substr(used);
    double mul = 1000;
    if (unit == "d")
        mul = 86400e3;
    else if (unit == "h")
        mul = 3600e3;
    else if (unit == "m")
        mul = 60e3;
    else if (unit != "s" && !unit.empty())
        return std::nullopt;
    if (!(v >= 0) || v * mul > 9e15) return std::nullopt;
    return int64_t(v * mul);
}

int topology_command(const std::string & synthetic, const std::string & xml, const PlacementFlags & f) {
    std::string err;
    auto po = placement_options(f, err);
    std::optional<engine::Topology> topo;
    if (po) {
        topo = !synthetic.empty() ? engine::Topology::synthetic(synthetic, err)
               : !xml.empty()     ? engine::Topology::xml(xml, err)
                                  : engine::Topology::detect(err);
    }
    auto plan = topo ? engine::plan_placement(*topo, *po, err) : std::nullopt;
    if (!plan) {
        return common::fail(err, 2);
    }
    fputs(engine::describe(*topo, *plan).c_str(), stdout);
    return 0;
}

}  // namespace armada::cli

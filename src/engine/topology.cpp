#include "engine/topology.h"

#include <hwloc.h>
#include <linux/mempolicy.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>

namespace armada::engine {

namespace {

struct TopologyDeleter {
    void operator()(hwloc_topology * t) const { hwloc_topology_destroy(t); }
};
using HwlocPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

std::vector<int> pus_of(hwloc_topology_t t, hwloc_const_cpuset_t set) {
    std::vector<int> pus;
    hwloc_obj_t pu = nullptr;
    while ((pu = hwloc_get_next_obj_inside_cpuset_by_type(t, set, HWLOC_OBJ_PU, pu)) != nullptr)
        pus.push_back(int(pu->os_index));
    return pus;
}

Topology from_hwloc(hwloc_topology_t t, std::string source) {
    Topology topo;
    topo.source = std::move(source);
    topo.packages = std::max(1, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE));
    const int n_nodes = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    // Cores, or PUs standing in for them where the machine reports no cores (some VMs).
    const hwloc_obj_type_t core_type = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    const int n_cores = hwloc_get_nbobjs_by_type(t, core_type);
    for (int i = 0; i < std::max(n_nodes, 1); ++i) {
        hwloc_obj_t numa = n_nodes > 0 ? hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, unsigned(i)) : nullptr;
        NumaNode node;
        node.os_index = numa ? int(numa->os_index) : 0;
        node.memory_bytes = numa ? numa->attr->numanode.local_memory : 0;
        for (int c = 0; c < n_cores; ++c) {
            hwloc_obj_t core = hwloc_get_obj_by_type(t, core_type, unsigned(c));
            if (numa && !hwloc_bitmap_isincluded(core->cpuset, numa->cpuset)) continue;
            Core k;
            k.id = int(core->logical_index);
            k.pus = pus_of(t, core->cpuset);
            if (k.pus.empty()) continue;
            if (node.cores.empty()) {
                hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, core);
                node.package = pkg ? int(pkg->logical_index) : 0;
            }
            node.cores.push_back(std::move(k));
        }
        if (!node.cores.empty()) topo.nodes.push_back(std::move(node));
    }
    return topo;
}

std::optional<Topology> load(const std::function<int(hwloc_topology_t)> & configure, std::string source,
                             std::string & err) {
    hwloc_topology_t raw = nullptr;
    if (hwloc_topology_init(&raw) != 0) {
        err = "hwloc: cannot initialise a topology";
        return std::nullopt;
    }
    HwlocPtr t(raw);
    if (configure && configure(t.get()) != 0) {
        err = "hwloc: cannot use " + source;
        return std::nullopt;
    }
    if (hwloc_topology_load(t.get()) != 0) {
        err = "hwloc: cannot load " + source;
        return std::nullopt;
    }
    auto topo = from_hwloc(t.get(), std::move(source));
    if (topo.nodes.empty()) {
        err = "hwloc: no usable cpus in " + topo.source;
        return std::nullopt;
    }
    return topo;
}

std::string read_first_line(const std::string & path) {
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    return line;
}

//! The process's cgroup directory (v2), or empty.
std::string cgroup_dir() {
    std::ifstream f("/proc/self/cgroup");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
    }
    return {};
}

void read_cgroup_limits(Topology & topo) {
    const std::string dir = cgroup_dir();
    if (!dir.empty()) {
        const std::string mem = read_first_line(dir + "/memory.max");
        if (!mem.empty() && mem != "max") topo.cgroup_memory_bytes = std::strtoull(mem.c_str(), nullptr, 10);
        std::istringstream cpu(read_first_line(dir + "/cpu.max"));
        std::string quota;
        double period = 0;
        if (cpu >> quota >> period && quota != "max" && period > 0)
            topo.cgroup_cpus = std::atof(quota.c_str()) / period;
        return;
    }
    // cgroup v1.
    const std::string mem = read_first_line("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    const uint64_t m = mem.empty() ? 0 : std::strtoull(mem.c_str(), nullptr, 10);
    if (m > 0 && m < (uint64_t(1) << 60)) topo.cgroup_memory_bytes = m;
    const double q = std::atof(read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").c_str());
    const double p = std::atof(read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_period_us").c_str());
    if (q > 0 && p > 0) topo.cgroup_cpus = q / p;
}

std::string gib(uint64_t bytes) {
    char b[32];
    snprintf(b, sizeof b, "%.1f GiB", double(bytes) / double(1ull << 30));
    return b;
}

}  // namespace

std::optional<Topology> Topology::detect(std::string & err) {
    // hwloc leaves out the cpus and nodes outside the process's cpuset by default.
    auto topo = load({}, "this machine", err);
    if (topo) read_cgroup_limits(*topo);
    return topo;
}

std::optional<Topology> Topology::synthetic(const std::string & description, std::string & err) {
    return load([&](hwloc_topology_t t) { return hwloc_topology_set_synthetic(t, description.c_str()); },
                "synthetic \"" + description + "\"", err);
}

std::optional<Topology> Topology::xml(const std::string & path, std::string & err) {
    return load([&](hwloc_topology_t t) { return hwloc_topology_set_xml(t, path.c_str()); }, "xml " + path, err);
}

void Topology::restrict_to(const std::vector<int> & cpus) {
    const std::set<int> keep(cpus.begin(), cpus.end());
    for (auto & n : nodes) {
        for (auto & c : n.cores)
            std::erase_if(c.pus, [&](int pu) { return !keep.count(pu); });
        std::erase_if(n.cores, [](const Core & c) { return c.pus.empty(); });
    }
    std::erase_if(nodes, [](const NumaNode & n) { return n.cores.empty(); });
}

size_t Topology::core_count() const {
    size_t n = 0;
    for (const auto & node : nodes)
        n += node.cores.size();
    return n;
}

size_t Topology::pu_count() const {
    size_t n = 0;
    for (const auto & node : nodes)
        for (const auto & c : node.cores)
            n += c.pus.size();
    return n;
}

std::optional<PlacementPlan> plan_placement(const Topology & topo, const PlacementOptions & opt, std::string & err) {
    if (opt.numa != "auto" && opt.numa != "off") {
        err = "--numa must be auto or off, not '" + opt.numa + "'";
        return std::nullopt;
    }
    Topology t = topo;
    PlacementPlan plan;
    if (!opt.cpus.empty()) {
        std::set<int> present;
        for (const auto & n : t.nodes)
            for (const auto & c : n.cores)
                present.insert(c.pus.begin(), c.pus.end());
        for (int cpu : opt.cpus) {
            if (!present.count(cpu)) {
                err = "--cpus: cpu " + std::to_string(cpu) + " is not available to this process";
                return std::nullopt;
            }
        }
        t.restrict_to(opt.cpus);
        plan.notes.push_back("restricted to cpus " + format_cpu_list(opt.cpus));
    }
    if (!opt.numa_nodes.empty()) {
        for (int want : opt.numa_nodes) {
            if (std::none_of(t.nodes.begin(), t.nodes.end(), [&](const NumaNode & n) { return n.os_index == want; })) {
                err = "--numa-nodes: node " + std::to_string(want) + " has no usable cpus";
                return std::nullopt;
            }
        }
        std::erase_if(t.nodes, [&](const NumaNode & n) {
            return std::find(opt.numa_nodes.begin(), opt.numa_nodes.end(), n.os_index) == opt.numa_nodes.end();
        });
    }
    if (t.nodes.empty()) {
        err = "no cpus left to run on";
        return std::nullopt;
    }
    auto threads_of = [&](const NumaNode & n) {
        std::vector<int> cpus;
        for (const auto & c : n.cores) {
            if (opt.smt)
                cpus.insert(cpus.end(), c.pus.begin(), c.pus.end());
            else
                cpus.push_back(c.pus.front());
        }
        return cpus;
    };
    if (opt.numa == "auto" && t.nodes.size() > 1) {
        for (const auto & n : t.nodes)
            plan.engines.push_back({{n.os_index}, threads_of(n), n.os_index});
        plan.notes.push_back(std::to_string(t.nodes.size()) +
                             " NUMA nodes: one engine per node, its threads and memory on that node");
    } else {
        EnginePlacement e;
        for (const auto & n : t.nodes) {
            e.numa_nodes.push_back(n.os_index);
            const auto cpus = threads_of(n);
            e.cpus.insert(e.cpus.end(), cpus.begin(), cpus.end());
        }
        e.memory_node = t.nodes.size() == 1 ? t.nodes.front().os_index : -1;
        if (t.nodes.size() > 1) plan.notes.push_back("--numa off: one engine across every node");
        plan.engines.push_back(std::move(e));
    }
    if (opt.engines < 0 || opt.engines > 1024) {
        err = "--engines must be between 1 and 1024";
        return std::nullopt;
    }
    if (opt.engines > 0 && size_t(opt.engines) != plan.engines.size()) {
        const size_t per = plan.engines.size();
        if (size_t(opt.engines) < per || size_t(opt.engines) % per != 0) {
            err = "--engines " + std::to_string(opt.engines) + " does not divide over " + std::to_string(per) +
                  (per == 1 ? " planned engine" : " NUMA nodes") + "; use a multiple of " + std::to_string(per) +
                  (per > 1 ? " or --numa off" : "");
            return std::nullopt;
        }
        const size_t split = size_t(opt.engines) / per;
        std::vector<EnginePlacement> out;
        for (const auto & e : plan.engines) {
            if (e.cpus.size() < split) {
                err = "--engines " + std::to_string(opt.engines) + ": " + std::to_string(e.cpus.size()) +
                      " cpus cannot give each engine a thread";
                return std::nullopt;
            }
            // Contiguous groups, the first ones one cpu larger when the split is uneven.
            size_t at = 0;
            for (size_t k = 0; k < split; ++k) {
                const size_t n = e.cpus.size() / split + (k < e.cpus.size() % split ? 1 : 0);
                EnginePlacement part = e;
                part.cpus.assign(e.cpus.begin() + long(at), e.cpus.begin() + long(at + n));
                at += n;
                out.push_back(std::move(part));
            }
        }
        plan.engines = std::move(out);
        plan.notes.push_back("--engines " + std::to_string(opt.engines) + ": " + std::to_string(split) +
                             (per == 1 ? " engines" : " engines per node") + ", cores split between them");
    }
    const bool has_smt = std::any_of(t.nodes.begin(), t.nodes.end(), [](const NumaNode & n) {
        return std::any_of(n.cores.begin(), n.cores.end(), [](const Core & c) { return c.pus.size() > 1; });
    });
    if (has_smt && !opt.smt)
        plan.notes.push_back("SMT siblings left idle: one thread per physical core (--smt uses them)");
    // A cgroup CPU quota below the planned threads: fewer threads, spread over the engines.
    size_t total = 0;
    for (const auto & e : plan.engines)
        total += e.cpus.size();
    if (t.cgroup_cpus > 0 && double(total) > t.cgroup_cpus) {
        const double allowed = std::max(1.0, std::floor(t.cgroup_cpus));
        for (auto & e : plan.engines) {
            const size_t keep =
                std::max<size_t>(1, size_t(std::floor(double(e.cpus.size()) * allowed / double(total))));
            e.cpus.resize(std::min(keep, e.cpus.size()));
        }
        char b[128];
        snprintf(b, sizeof b, "cgroup CPU quota of %.2f cpus: threads cut to fit", t.cgroup_cpus);
        plan.notes.push_back(b);
    }
    return plan;
}

std::string describe(const Topology & topo, const PlacementPlan & plan) {
    std::ostringstream o;
    o << "topology (" << topo.source << "): " << topo.packages << (topo.packages == 1 ? " package, " : " packages, ")
      << topo.nodes.size() << (topo.nodes.size() == 1 ? " NUMA node, " : " NUMA nodes, ") << topo.core_count()
      << " cores, " << topo.pu_count() << " hardware threads\n";
    for (const auto & n : topo.nodes) {
        std::vector<int> pus;
        for (const auto & c : n.cores)
            pus.insert(pus.end(), c.pus.begin(), c.pus.end());
        std::sort(pus.begin(), pus.end());
        o << "  node " << n.os_index << ": package " << n.package << ", " << gib(n.memory_bytes) << ", "
          << n.cores.size() << " cores, cpus " << format_cpu_list(pus) << "\n";
    }
    o << "cgroup: memory " << (topo.cgroup_memory_bytes ? gib(topo.cgroup_memory_bytes) : std::string("unlimited"))
      << ", cpus ";
    if (topo.cgroup_cpus > 0)
        o << topo.cgroup_cpus;
    else
        o << "unlimited";
    o << "\nplan: " << plan.engines.size() << (plan.engines.size() == 1 ? " engine\n" : " engines\n");
    for (size_t i = 0; i < plan.engines.size(); ++i) {
        const auto & e = plan.engines[i];
        std::ostringstream nodes;
        for (size_t k = 0; k < e.numa_nodes.size(); ++k)
            nodes << (k ? "," : "") << e.numa_nodes[k];
        o << "  engine " << i << ": node " << nodes.str() << ", " << e.cpus.size() << " threads on cpus "
          << format_cpu_list(e.cpus) << ", memory node "
          << (e.memory_node >= 0 ? std::to_string(e.memory_node) : std::string("any")) << "\n";
    }
    for (const auto & n : plan.notes)
        o << "note: " << n << "\n";
    return o.str();
}

std::optional<std::vector<int>> parse_cpu_list(const std::string & text) {
    std::vector<int> cpus;
    if (text.empty() || text.back() == ',') return std::nullopt;
    std::istringstream in(text);
    std::string part;
    while (std::getline(in, part, ',')) {
        if (part.empty()) return std::nullopt;
        const auto dash = part.find('-');
        try {
            size_t used = 0;
            const int a = std::stoi(part.substr(0, dash), &used);
            if (used != (dash == std::string::npos ? part.size() : dash) || a < 0) return std::nullopt;
            int b = a;
            if (dash != std::string::npos) {
                const std::string hi = part.substr(dash + 1);
                b = std::stoi(hi, &used);
                if (used != hi.size() || b < a) return std::nullopt;
            }
            if (b > 65535) return std::nullopt;
            for (int c = a; c <= b; ++c)
                cpus.push_back(c);
        } catch (const std::exception &) {
            return std::nullopt;
        }
    }
    if (cpus.empty()) return std::nullopt;
    std::sort(cpus.begin(), cpus.end());
    cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
    return cpus;
}

std::string format_cpu_list(const std::vector<int> & in) {
    std::vector<int> cpus = in;
    std::sort(cpus.begin(), cpus.end());
    std::ostringstream o;
    for (size_t i = 0; i < cpus.size();) {
        size_t j = i;
        while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1)
            ++j;
        o << (i ? "," : "") << cpus[i];
        if (j > i) o << "-" << cpus[j];
        i = j + 1;
    }
    return o.str();
}

std::string pin_current_thread(const std::vector<int> & cpus) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) {
        if (c < 0 || c >= CPU_SETSIZE) return "cpu " + std::to_string(c) + " is out of range";
        CPU_SET(c, &set);
    }
    if (int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set); rc != 0)
        return "cannot pin the thread to cpus " + format_cpu_list(cpus) + ": error " + std::to_string(rc);
    return {};
}

std::string prefer_memory_node(int node) {
    long rc = 0;
    if (node < 0) {
        rc = syscall(SYS_set_mempolicy, MPOL_DEFAULT, nullptr, 0UL);
    } else {
        constexpr size_t kBits = 8 * sizeof(unsigned long);
        if (size_t(node) >= 16 * kBits) return "memory node " + std::to_string(node) + " is out of range";
        unsigned long mask[16] = {};
        mask[size_t(node) / kBits] = 1UL << (size_t(node) % kBits);
        rc = syscall(SYS_set_mempolicy, MPOL_PREFERRED, mask, 16 * kBits);
    }
    if (rc != 0) return "cannot prefer memory node " + std::to_string(node) + ": " + std::strerror(errno);
    return {};
}

int preferred_memory_node() {
    constexpr size_t kBits = 8 * sizeof(unsigned long);
    int mode = 0;
    unsigned long mask[16] = {};
    if (syscall(SYS_get_mempolicy, &mode, mask, 16 * kBits, nullptr, 0UL) != 0 || mode != MPOL_PREFERRED) return -1;
    for (size_t i = 0; i < 16 * kBits; ++i)
        if (mask[i / kBits] & (1UL << (i % kBits))) return int(i);
    return -1;
}

}  // namespace armada::engine

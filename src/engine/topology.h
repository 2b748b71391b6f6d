#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace armada::engine {

//! One physical core and its hardware threads (OS cpu numbers; the first is the one used
//! without SMT).
struct Core {
    int id = 0;  // logical index among the machine's cores
    std::vector<int> pus;
};

struct NumaNode {
    int os_index = 0;
    int package = 0;
    uint64_t memory_bytes = 0;
    std::vector<Core> cores;
};

//! The CPUs and memory this process may use: NUMA nodes, packages, physical cores and their
//! SMT siblings, read with hwloc. The live topology honours the process's cpuset (what a
//! Kubernetes static CPU manager gives a Guaranteed pod) and records cgroup limits.
struct Topology {
    std::vector<NumaNode> nodes;
    int packages = 0;
    uint64_t cgroup_memory_bytes = 0;  // memory.max of the cgroup; 0: none
    double cgroup_cpus = 0;            // cpu.max quota / period; 0: none
    std::string source;

    //! This machine. On error, returns nullopt and sets `err`.
    static std::optional<Topology> detect(std::string & err);
    //! An hwloc synthetic description, e.g. "pack:2 numa:2 core:32 pu:1".
    static std::optional<Topology> synthetic(const std::string & description, std::string & err);
    //! An hwloc XML export (lstopo --of xml).
    static std::optional<Topology> xml(const std::string & path, std::string & err);

    //! Keeps only the given OS cpus (cores and nodes left empty disappear).
    void restrict_to(const std::vector<int> & cpus);
    size_t core_count() const;
    size_t pu_count() const;
};

//! How the node places its engines.
struct PlacementOptions {
    std::string numa = "auto";    // auto: one engine per NUMA node when there are several; off: one engine
    std::vector<int> cpus;        // --cpus: only these OS cpus
    std::vector<int> numa_nodes;  // --numa-nodes: only these nodes
    bool smt = false;             // use SMT siblings as compute threads too
    //! --engines: how many engines in all; 0 = one per planned NUMA node (or one). More than
    //! the nodes splits each node's cores evenly; it must be a multiple of the node count.
    int engines = 0;
};

//! Where one engine runs: its compute threads, one per listed cpu, and its memory node.
struct EnginePlacement {
    std::vector<int> numa_nodes;  // nodes its cores come from
    std::vector<int> cpus;        // one compute thread pinned to each
    int memory_node = -1;         // -1: no single node (weights and KV follow first touch)
};

struct PlacementPlan {
    std::vector<EnginePlacement> engines;
    std::vector<std::string> notes;  // why the plan looks as it does
};

//! The plan for `topo` under `opt`. Returns nullopt and sets `err` when nothing is left to
//! run on, or an option names a cpu or node that is not there.
std::optional<PlacementPlan> plan_placement(const Topology & topo, const PlacementOptions & opt, std::string & err);

//! Human-readable topology and plan, as `armada topology` prints it.
std::string describe(const Topology & topo, const PlacementPlan & plan);

//! Parses a Linux cpu list ("0-3,8,10-11"). Returns nullopt on a malformed list.
std::optional<std::vector<int>> parse_cpu_list(const std::string & text);
//! Formats cpus as a compact list ("0-3,8").
std::string format_cpu_list(const std::vector<int> & cpus);

//! Pins the calling thread to `cpus`. Returns an error message, empty on success.
std::string pin_current_thread(const std::vector<int> & cpus);

//! Makes the calling thread allocate new pages on NUMA node `node` first (MPOL_PREFERRED:
//! another node is used only when this one is full, rather than failing). Threads it starts
//! inherit the preference. `node` < 0 goes back to the default, local allocation. Returns an
//! error message, empty on success.
std::string prefer_memory_node(int node);
//! The calling thread's preferred node, or -1 under any other policy.
int preferred_memory_node();

}  // namespace armada::engine

#include "engine/topology.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>
#include <hwloc.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <thread>

using namespace armada::engine;

namespace {

Topology synth(const std::string & desc) {
    std::string err;
    auto t = Topology::synthetic(desc, err);
    EXPECT_TRUE(t) << err;
    return t ? *t : Topology{};
}

PlacementPlan plan(const Topology & t, const PlacementOptions & o = {}) {
    std::string err;
    auto p = plan_placement(t, o, err);
    EXPECT_TRUE(p) << err;
    return p ? *p : PlacementPlan{};
}

std::string plan_error(const Topology & t, const PlacementOptions & o) {
    std::string err;
    EXPECT_FALSE(plan_placement(t, o, err));
    return err;
}

// Every cpu of `cpus` lies in NUMA node `node` of `t`.
bool all_on_node(const Topology & t, const std::vector<int> & cpus, int node) {
    std::set<int> on;
    for (const auto & n : t.nodes)
        if (n.os_index == node)
            for (const auto & c : n.cores)
                on.insert(c.pus.begin(), c.pus.end());
    for (int c : cpus)
        if (!on.count(c)) return false;
    return true;
}

const char * kKunpeng = "pack:2 numa:2 core:32 pu:1";  // 2 sockets x 2 NUMA nodes x 32 cores, no SMT
const char * kEpyc = "pack:2 [numa] core:64 pu:2";     // 2 sockets x 64 cores, SMT 2

}  // namespace

TEST(Topology, KunpengStyleGetsOneEnginePerNumaNode) {
    const Topology t = synth(kKunpeng);
    EXPECT_EQ(t.packages, 2);
    ASSERT_EQ(t.nodes.size(), 4u);
    EXPECT_EQ(t.core_count(), 128u);
    EXPECT_EQ(t.nodes[0].package, 0);
    EXPECT_EQ(t.nodes[3].package, 1);
    const PlacementPlan p = plan(t);
    ASSERT_EQ(p.engines.size(), 4u);
    std::set<int> used;
    for (size_t i = 0; i < 4; ++i) {
        const auto & e = p.engines[i];
        EXPECT_EQ(e.numa_nodes, std::vector<int>{t.nodes[i].os_index});
        EXPECT_EQ(e.memory_node, t.nodes[i].os_index);
        EXPECT_EQ(e.cpus.size(), 32u);
        EXPECT_TRUE(all_on_node(t, e.cpus, e.memory_node));
        for (int c : e.cpus)
            EXPECT_TRUE(used.insert(c).second) << "cpu " << c << " given twice";
    }
    const std::string text = describe(t, p);
    EXPECT_NE(text.find("4 NUMA nodes, 128 cores"), std::string::npos) << text;
    EXPECT_NE(text.find("engine 3: node 3, 32 threads on cpus 96-127, memory node 3"), std::string::npos) << text;
}

TEST(Topology, NumaOffIsOneEngineAcrossNodes) {
    const Topology t = synth(kKunpeng);
    PlacementOptions o;
    o.numa = "off";
    const PlacementPlan p = plan(t, o);
    ASSERT_EQ(p.engines.size(), 1u);
    EXPECT_EQ(p.engines[0].cpus.size(), 128u);
    EXPECT_EQ(p.engines[0].memory_node, -1);
    EXPECT_EQ(p.engines[0].numa_nodes.size(), 4u);
}

TEST(Topology, EpycStyleLeavesSmtSiblingsIdleUnlessAsked) {
    const Topology t = synth(kEpyc);
    ASSERT_EQ(t.nodes.size(), 2u);
    EXPECT_EQ(t.core_count(), 128u);
    EXPECT_EQ(t.pu_count(), 256u);
    PlacementPlan p = plan(t);
    ASSERT_EQ(p.engines.size(), 2u);
    for (const auto & e : p.engines) {
        ASSERT_EQ(e.cpus.size(), 64u);
        // One thread per physical core: no two cpus of an engine are siblings.
        std::set<int> cores;
        for (int cpu : e.cpus)
            for (const auto & n : t.nodes)
                for (const auto & c : n.cores)
                    if (std::find(c.pus.begin(), c.pus.end(), cpu) != c.pus.end()) cores.insert(c.id);
        EXPECT_EQ(cores.size(), 64u);
    }
    bool noted = false;
    for (const auto & n : p.notes)
        noted = noted || n.find("SMT siblings left idle") != std::string::npos;
    EXPECT_TRUE(noted);

    PlacementOptions smt;
    smt.smt = true;
    p = plan(t, smt);
    ASSERT_EQ(p.engines.size(), 2u);
    EXPECT_EQ(p.engines[0].cpus.size(), 128u);
}

TEST(Topology, OneNodeIsOneEngine) {
    const Topology t = synth("numa:1 core:2 pu:1");
    const PlacementPlan p = plan(t);
    ASSERT_EQ(p.engines.size(), 1u);
    EXPECT_EQ(p.engines[0].cpus, (std::vector<int>{0, 1}));
    EXPECT_EQ(p.engines[0].memory_node, t.nodes[0].os_index);
}

TEST(Topology, CpusetOfHalfANodeIsOneEngineOnThatHalf) {
    Topology t = synth(kKunpeng);
    std::vector<int> half;
    for (int c = 0; c < 16; ++c)
        half.push_back(t.nodes[0].cores[size_t(c)].pus[0]);
    // As the cpuset of a container would leave it...
    Topology restricted = t;
    restricted.restrict_to(half);
    ASSERT_EQ(restricted.nodes.size(), 1u);
    PlacementPlan p = plan(restricted);
    ASSERT_EQ(p.engines.size(), 1u);
    EXPECT_EQ(p.engines[0].cpus, half);
    EXPECT_EQ(p.engines[0].memory_node, t.nodes[0].os_index);
    // ...and as --cpus says it.
    PlacementOptions o;
    o.cpus = half;
    p = plan(t, o);
    ASSERT_EQ(p.engines.size(), 1u);
    EXPECT_EQ(p.engines[0].cpus, half);
}

TEST(Topology, NumaNodesOptionPicksNodes) {
    const Topology t = synth(kKunpeng);
    PlacementOptions o;
    o.numa_nodes = {t.nodes[1].os_index, t.nodes[3].os_index};
    const PlacementPlan p = plan(t, o);
    ASSERT_EQ(p.engines.size(), 2u);
    EXPECT_EQ(p.engines[0].memory_node, t.nodes[1].os_index);
    EXPECT_EQ(p.engines[1].memory_node, t.nodes[3].os_index);
}

TEST(Topology, CgroupQuotaCutsThreads) {
    Topology t = synth(kKunpeng);
    t.cgroup_cpus = 8.5;
    const PlacementPlan p = plan(t);
    size_t total = 0;
    for (const auto & e : p.engines) {
        EXPECT_GE(e.cpus.size(), 1u);
        total += e.cpus.size();
    }
    EXPECT_LE(total, 8u);
}

TEST(Topology, BadOptionsAreRefusedWithAReason) {
    const Topology t = synth(kKunpeng);
    PlacementOptions o;
    o.numa = "yes";
    EXPECT_NE(plan_error(t, o).find("--numa must be auto or off"), std::string::npos);
    o = {};
    o.cpus = {4096};
    EXPECT_NE(plan_error(t, o).find("cpu 4096 is not available"), std::string::npos);
    o = {};
    o.numa_nodes = {9};
    EXPECT_NE(plan_error(t, o).find("node 9"), std::string::npos);
    std::string err;
    EXPECT_FALSE(Topology::synthetic("pack:banana", err));
    EXPECT_FALSE(err.empty());
}

TEST(Topology, ReadsAnXmlExport) {
    hwloc_topology_t h = nullptr;
    ASSERT_EQ(hwloc_topology_init(&h), 0);
    ASSERT_EQ(hwloc_topology_set_synthetic(h, kKunpeng), 0);
    ASSERT_EQ(hwloc_topology_load(h), 0);
    const std::string path = ::testing::TempDir() + "/kunpeng.xml";
    ASSERT_EQ(hwloc_topology_export_xml(h, path.c_str(), 0), 0);
    hwloc_topology_destroy(h);
    std::string err;
    auto t = Topology::xml(path, err);
    ASSERT_TRUE(t) << err;
    EXPECT_EQ(t->nodes.size(), 4u);
    EXPECT_EQ(t->core_count(), 128u);
    std::remove(path.c_str());
}

TEST(Topology, CpuLists) {
    EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
    EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
    EXPECT_EQ(parse_cpu_list("3,1,1"), (std::vector<int>{1, 3}));
    for (const char * bad : {"", ",", "1,", "a", "3-1", "-1", "1-", "1-2-3", "0x2", "99999"})
        EXPECT_FALSE(parse_cpu_list(bad)) << bad;
    EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
    EXPECT_EQ(format_cpu_list({7}), "7");
}

TEST(Topology, ThisMachineAndARealPin) {
    std::string err;
    auto t = Topology::detect(err);
    ASSERT_TRUE(t) << err;
    ASSERT_FALSE(t->nodes.empty());
    const PlacementPlan p = plan(*t);
    ASSERT_GE(p.engines.size(), 1u);
    const int cpu = p.engines[0].cpus.front();
    std::string allowed;
    std::thread([&] {
        ASSERT_EQ(pin_current_thread({cpu}), "");
        std::ifstream f("/proc/self/task/" + std::to_string(syscall(SYS_gettid)) + "/status");
        std::string line;
        while (std::getline(f, line))
            if (line.rfind("Cpus_allowed_list:", 0) == 0) allowed = line.substr(line.find_first_not_of(" \t", 18));
    }).join();
    EXPECT_EQ(allowed, std::to_string(cpu));
}

TEST(Topology, EnginesOptionSplitsEachNodesCores) {
    const Topology t = synth(kKunpeng);
    PlacementOptions o;
    o.engines = 8;
    const PlacementPlan p = plan(t, o);
    ASSERT_EQ(p.engines.size(), 8u);
    std::set<int> seen;
    for (size_t i = 0; i < p.engines.size(); ++i) {
        const auto & e = p.engines[i];
        EXPECT_EQ(e.cpus.size(), 16u);
        EXPECT_EQ(e.memory_node, t.nodes[i / 2].os_index) << i;
        EXPECT_TRUE(all_on_node(t, e.cpus, e.memory_node)) << i;
        seen.insert(e.cpus.begin(), e.cpus.end());
    }
    EXPECT_EQ(seen.size(), 128u) << "every core used once";

    // One node split unevenly: 5 cores over 2 engines gives 3 + 2, same memory node.
    const Topology one = synth("numa:1 core:5 pu:1");
    o.engines = 2;
    const PlacementPlan q = plan(one, o);
    ASSERT_EQ(q.engines.size(), 2u);
    EXPECT_EQ(q.engines[0].cpus.size(), 3u);
    EXPECT_EQ(q.engines[1].cpus.size(), 2u);
    EXPECT_EQ(q.engines[0].memory_node, q.engines[1].memory_node);
    o.engines = 1;
    EXPECT_EQ(plan(one, o).engines.size(), 1u);

    o.engines = 6;
    EXPECT_EQ(plan_error(t, o), "--engines 6 does not divide over 4 NUMA nodes; use a multiple of 4 or --numa off");
    o.engines = 6;
    EXPECT_EQ(plan_error(one, o), "--engines 6: 5 cpus cannot give each engine a thread");
    o.engines = -1;
    EXPECT_EQ(plan_error(one, o), "--engines must be between 1 and 1024");
    o.numa = "off";
    o.engines = 6;
    EXPECT_EQ(plan(t, o).engines.size(), 6u) << "--numa off: one engine over all nodes, split in six";
}

TEST(Topology, PreferMemoryNodeSetsTheThreadsPolicyOrLeavesItLocal) {
    // A fresh thread, so the test runner's own policy is left alone.
    std::string err_set, err_reset, maps;
    int seen = -2, after = -2, child = -2;
    std::thread([&] {
        err_set = prefer_memory_node(0);
        seen = preferred_memory_node();
        // Threads started now inherit it.
        std::thread([&] { child = preferred_memory_node(); }).join();
        // New memory follows it: the kernel shows the policy of this thread's mappings.
        std::ifstream f("/proc/thread-self/numa_maps");
        maps.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
        err_reset = prefer_memory_node(-1);
        after = preferred_memory_node();
    }).join();
    EXPECT_EQ(prefer_memory_node(1 << 20), "memory node 1048576 is out of range");
    const bool forbidden = err_set.find(std::strerror(EPERM)) != std::string::npos ||
                           err_set.find(std::strerror(ENOSYS)) != std::string::npos;
    if (forbidden) {
        // Containers without CAP_SYS_NICE (EPERM) and qemu-user (ENOSYS) refuse memory policies:
        // the node says why, and memory stays with first touch, as it would anyway.
        EXPECT_NE(err_set.find("cannot prefer memory node 0"), std::string::npos) << err_set;
        EXPECT_EQ(seen, -1);
        EXPECT_EQ(child, -1);
        return;
    }
    EXPECT_EQ(err_set, "");
    EXPECT_EQ(seen, 0);
    EXPECT_EQ(child, 0);
    EXPECT_NE(maps.find(" prefer:0 "), std::string::npos) << maps.substr(0, 400);
    EXPECT_EQ(err_reset, "");
    EXPECT_EQ(after, -1);
}

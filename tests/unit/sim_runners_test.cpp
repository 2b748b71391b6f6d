// The simulator's runner world: the cluster's own runners over in-memory etcd, NATS and
// PostgreSQL, under a seeded nemesis. Each seed must complete every session with no violation.

#include "sim/runners.h"

#include <gtest/gtest.h>

#include <cstdlib>

using namespace armada::sim;

namespace {

std::string show(const RunnerResult & r) {
    std::string out = std::to_string(r.completed) + "/" + std::to_string(r.sessions) + " completed\n";
    for (const auto & v : r.violations)
        out += "  violation: " + v + "\n";
    for (const auto & f : r.faults)
        out += "  fault: " + f + "\n";
    return out;
}

}  // namespace

TEST(SimRunners, WithoutFaultsEverySessionCompletesOnce) {
    RunnerScenario s;
    s.faults = false;
    const RunnerResult r = run_runners(s, 1);
    EXPECT_TRUE(r.ok()) << show(r);
    EXPECT_EQ(r.runs, s.sessions) << "each placed once";
    EXPECT_EQ(r.steps_acked, int64_t(s.sessions) * s.steps);
    EXPECT_EQ(r.rehomes, 0);
    EXPECT_GT(r.leader_changes, 0);
}

TEST(SimRunners, ASweepOfSeedsUnderTheNemesisHolds) {
    // ARMADA_SIM_SEEDS raises it (the 2,000-seed sweep: `make sweep`).
    const char * env = std::getenv("ARMADA_SIM_SEEDS");
    const int seeds = env ? std::atoi(env) : 40;
    RunnerScenario s;
    int faults = 0;
    for (int seed = 1; seed <= seeds; ++seed) {
        const RunnerResult r = run_runners(s, uint64_t(seed));
        ASSERT_TRUE(r.ok()) << "seed " << seed << ": " << show(r);
        faults += int(r.faults.size());
    }
    EXPECT_GT(faults, seeds * 3) << "the nemesis injected faults";
}

TEST(SimRunners, AScenarioFileSetsTheWorldAndRefusesWhatItDoesNotKnow) {
    std::string err;
    const auto s =
        parse_runner_scenario("world: runners\ncells: 64\nnodes_per_cell: 64\nsessions: 100\ncomplete: false\n", err);
    ASSERT_TRUE(s) << err;
    EXPECT_EQ(s->cells, 64);
    EXPECT_EQ(s->nodes_per_cell, 64);
    EXPECT_EQ(s->sessions, 100);
    EXPECT_FALSE(s->complete);
    EXPECT_FALSE(parse_runner_scenario("world: runners\ncels: 4\n", err));
    EXPECT_NE(err.find("unknown setting 'cels'"), std::string::npos) << err;
    EXPECT_FALSE(parse_runner_scenario("world: runners\ncells: 0\n", err));
    EXPECT_NE(err.find("cells"), std::string::npos) << err;
    EXPECT_FALSE(parse_runner_scenario("world: runners\nsessions: many\n", err));
    EXPECT_FALSE(parse_runner_scenario("world: runners\ntick_ms: 1000\nlease_ttl_ms: 2000\n", err));
}

// The simulator: the same scenario and seed replay the same run; its scenario file is checked.
#include <gtest/gtest.h>

#include "sim/scenario.h"
#include "sim/sim.h"

namespace armada::sim {
namespace {

const char * kSmall = R"(
name: tiny
cells: 2
nodes_per_cell: 3
duration_s: 60
node: {sessions: 8}
tenants:
  - {name: a, rate_per_s: 0.5, steps: 4, tool_ms: 500, think_ms: 1000, initial: 6}
  - {name: b, rate_per_s: 0.3, steps: 3, tool_ms: 800, initial: 4}
faults:
  - {kind: node_crash, at_s: 10, cell: 0, node: 1}
  - {kind: node_hang, at_s: 20, cell: 1, node: 0, for_s: 6}
  - {kind: cell_lost, at_s: 30, cell: 1, for_s: 20}
buggify: true
)";

Scenario small() {
    std::string err;
    auto s = parse_scenario(kSmall, err);
    EXPECT_TRUE(s) << err;
    return *s;
}

TEST(Sim, TheSameSeedGivesTheSameTraceAndAnotherSeedAnother) {
    const Scenario s = small();
    const auto a = run(s, {7, true});
    const auto b = run(s, {7, true});
    ASSERT_GT(a.events, 100u);
    EXPECT_EQ(a.trace_hash, b.trace_hash);
    EXPECT_EQ(a.trace, b.trace);  // byte for byte
    const auto c = run(s, {8, true});
    EXPECT_NE(a.trace_hash, c.trace_hash);
    EXPECT_NE(a.trace, c.trace);
}

TEST(Sim, FaultsHitSessionsAndEveryOneResumes) {
    const auto r = run(small(), {3, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    ASSERT_EQ(r.faults.size(), 3u);
    EXPECT_GT(r.faults[0].sessions_hit, 0);  // the crashed node ran sessions
    EXPECT_EQ(r.faults[0].resumed, r.faults[0].sessions_hit);
    // The lease runs out within its TTL (3 s), then the brain re-places at once.
    EXPECT_GT(r.faults[0].last_resume_s, 0);
    EXPECT_LT(r.faults[0].last_resume_s, 3.0 + 2.0);
    EXPECT_GT(r.faults[2].sessions_hit, 0);
    EXPECT_EQ(r.faults[2].resumed, r.faults[2].sessions_hit);
    EXPECT_GT(r.sessions_completed, 0);
}

TEST(Sim, AScenarioWithAnUnknownOrOutOfRangeSettingIsRefusedByName) {
    std::string err;
    EXPECT_FALSE(parse_scenario("cells: 2\nnodez: 3\ntenants: [{}]\n", err));
    EXPECT_NE(err.find("'nodez'"), std::string::npos) << err;
    EXPECT_FALSE(parse_scenario("cells: 0\ntenants: [{}]\n", err));
    EXPECT_NE(err.find("cells"), std::string::npos) << err;
    EXPECT_FALSE(parse_scenario("cells: 2\ntenants: [{}]\nfaults: [{kind: meteor}]\n", err));
    EXPECT_NE(err.find("faults[0].kind"), std::string::npos) << err;
    EXPECT_FALSE(parse_scenario("cells: 2\ntenants: [{}]\nfaults: [{kind: node_crash, cell: 5}]\n", err));
    EXPECT_NE(err.find("faults[0].cell"), std::string::npos) << err;
    EXPECT_FALSE(parse_scenario("cells: 2\n", err));
    EXPECT_NE(err.find("tenants"), std::string::npos) << err;
    EXPECT_FALSE(parse_scenario("[unclosed", err));
    EXPECT_TRUE(parse_scenario("tenants: [{}]\n", err)) << err;
}

}  // namespace
}  // namespace armada::sim

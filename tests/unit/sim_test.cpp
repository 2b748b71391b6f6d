// The simulator: the same scenario and seed replay the same run; its scenario file is checked.
#include <gtest/gtest.h>

#include <set>

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

TEST(Sim, BuggifyDeliversSomeEtcdWatchEventsLateAndTheInvariantsHold) {
    Scenario s = small();
    const auto late = run(s, {5, false});
    EXPECT_TRUE(late.violations.empty()) << late.violations.front().what;
    EXPECT_GT(late.watch_late, 0);
    s.buggify = false;
    EXPECT_EQ(run(s, {5, false}).watch_late, 0);
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

TEST(Sim, AClosedLoopKeepsItsSessionsInFlightAndPrefillSlowsEachStep) {
    // The agents bench's shape: 4 sessions in flight, 10 in all, each exactly 3 steps.
    const char * loop = R"(
name: loop
cells: 1
nodes_per_cell: 1
duration_s: 600
node: {sessions: 8, tokens_per_s: 100, seq_tokens_per_s: 40, step_tokens: 40}
tenants:
  - {name: bench, concurrency: 4, sessions: 10, steps: 3, tool_ms: 1000}
)";
    std::string err;
    auto s = parse_scenario(loop, err);
    ASSERT_TRUE(s) << err;
    const auto r = run(*s, {1, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    EXPECT_EQ(r.sessions_started, 10);
    EXPECT_EQ(r.sessions_completed, 10);
    EXPECT_EQ(r.steps, 30);
    for (const auto n : r.live)
        ASSERT_LE(n, 4);
    ASSERT_GT(r.last_completed_ms, 0);
    // Reading 200 prompt tokens a step at 400 a second makes every step, and the whole, longer.
    s->node.prefill_tokens_per_s = 400;
    s->node.step_prompt_tokens = 200;
    const auto p = run(*s, {1, false});
    EXPECT_EQ(p.sessions_completed, 10);
    EXPECT_GT(p.last_completed_ms, r.last_completed_ms + 3 * 500);
    // A closed loop and an arrival rate together are refused.
    EXPECT_FALSE(
        parse_scenario(std::string(loop).replace(std::string(loop).find("concurrency"), 0, "rate_per_s: 1, "), err));
    EXPECT_NE(err.find("exclude each other"), std::string::npos) << err;
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
    EXPECT_FALSE(parse_scenario("tenants: [{}]\nrollout: {wave_percent: 0}\n", err));
    EXPECT_NE(err.find("rollout.wave_percent"), std::string::npos) << err;
    EXPECT_FALSE(parse_scenario("tenants: [{}]\nrollout: {waves: 3}\n", err));
    EXPECT_NE(err.find("'waves'"), std::string::npos) << err;
    EXPECT_FALSE(parse_scenario("tenants: [{tool_dist: gauss}]\n", err));
    EXPECT_NE(err.find("tenants[0].tool_dist"), std::string::npos) << err;
    EXPECT_TRUE(parse_scenario("tenants: [{tool_dist: uniform}]\n", err)) << err;
    EXPECT_FALSE(parse_scenario("tenants: [{}]\nfaults: [{kind: pg_outage, at_s: 5}]\n", err));
    EXPECT_NE(err.find("faults[0].for_s"), std::string::npos) << err;
    EXPECT_TRUE(parse_scenario("tenants: [{}]\nfaults: [{kind: nats_outage, at_s: 5, for_s: 2}]\n", err)) << err;
}

// Two cells of 3 nodes, and a dependency out from 10 s.
Scenario outage(const std::string & fault) {
    std::string err;
    auto s = parse_scenario(R"(
cells: 2
nodes_per_cell: 3
duration_s: 90
node: {sessions: 16}
tenants:
  - {name: a, rate_per_s: 1, steps: 8, tool_ms: 500, think_ms: 1000, initial: 30}
)" + (fault.empty() ? std::string() : "faults: [" + fault + "]\n"),
                            err);
    EXPECT_TRUE(s) << err;
    return *s;
}

TEST(Sim, APostgresOutageHoldsEveryRunAtItsLastCommitAndTheyGoOnWhereTheyWereAfter) {
    const auto base = run(outage(""), {3, false});
    const auto r = run(outage("{kind: pg_outage, at_s: 10, for_s: 20}"), {3, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    ASSERT_EQ(r.faults.size(), 1u);
    EXPECT_EQ(r.faults[0].what, "PostgreSQL outage");
    EXPECT_GT(r.faults[0].sessions_hit, 20);
    EXPECT_EQ(r.faults[0].resumed, r.faults[0].sessions_hit);
    EXPECT_GE(r.faults[0].last_resume_s, 20.0);  // not before it is back
    EXPECT_LT(r.faults[0].last_resume_s, 21.0);  // and then at once, on their own nodes
    EXPECT_EQ(r.faults[0].peak_moves_per_s, 0);
    // Not one commit while it is out; new sessions' placements were tried and refused.
    for (size_t t = 11; t < 30; ++t)
        EXPECT_EQ(r.pg_commits.at(t), 0) << "second " << t;
    EXPECT_GT(base.pg_commits.at(20), 0);
    EXPECT_EQ(r.sessions_stranded, 0);
}

TEST(Sim, ACellCutOffFromNatsPastTheReportTtlKeepsItsSessionsAndIsNotTakenForLost) {
    const auto r = run(outage("{kind: nats_partition, at_s: 10, cell: 1, for_s: 30}"), {3, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    ASSERT_EQ(r.faults.size(), 1u);
    EXPECT_EQ(r.faults[0].what, "NATS cut off from cell1");
    // Its new sessions waited for their messages; none was moved to the other cell, since its
    // report still reached the global brain through etcd.
    EXPECT_GT(r.faults[0].sessions_hit, 0);
    EXPECT_EQ(r.faults[0].resumed, r.faults[0].sessions_hit);
    EXPECT_GE(r.faults[0].last_resume_s, 30.0);
    EXPECT_EQ(r.rehomes, 0);
    EXPECT_EQ(r.fenced_writes, 0);
    EXPECT_EQ(r.sessions_stranded, 0);
}

TEST(Sim, ANatsOutagePastTheReportTtlHoldsMessagesUntilItEndsAndReHomesNothing) {
    const auto r = run(outage("{kind: nats_outage, at_s: 10, for_s: 20}"), {3, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    ASSERT_EQ(r.faults.size(), 1u);
    EXPECT_EQ(r.faults[0].what, "NATS outage");
    // New sessions waited for their place requests and run commands to get through.
    EXPECT_GT(r.faults[0].sessions_hit, 5);
    EXPECT_EQ(r.faults[0].resumed, r.faults[0].sessions_hit);
    EXPECT_GE(r.faults[0].last_resume_s, 20.0);
    EXPECT_LT(r.faults[0].last_resume_s, 23.0);
    // Nothing is re-homed. (With every cell silent at once there would be nowhere to re-home to
    // anyway; the cut-off cell's test above is the one that shows the reports' etcd path.)
    EXPECT_EQ(r.rehomes, 0);
    EXPECT_EQ(r.sessions_stranded, 0);
}

// One cell of 3 nodes; a node is cut off from etcd and NATS (not from PostgreSQL) at 10 s.
Scenario partitioned(double for_s) {
    std::string err;
    auto s = parse_scenario(R"(
cells: 1
nodes_per_cell: 3
duration_s: 120
node: {sessions: 16}
tenants:
  - {name: a, rate_per_s: 1, steps: 8, tool_ms: 500, think_ms: 1000, initial: 24}
faults:
  - {kind: partition, at_s: 10, cell: 0, node: 1, for_s: )" +
                                std::to_string(for_s) + "}\n",
                            err);
    EXPECT_TRUE(s) << err;
    return *s;
}

TEST(Sim, APartitionPastTheLeaseMovesTheNodesSessionsAndFencesItsLateCommits) {
    const auto r = run(partitioned(10), {4, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    ASSERT_EQ(r.faults.size(), 1u);
    EXPECT_EQ(r.faults[0].what, "partition cell0-n1");
    EXPECT_GT(r.faults[0].sessions_hit, 0);
    EXPECT_EQ(r.faults[0].resumed, r.faults[0].sessions_hit);
    // Resumed elsewhere after the lease (3 s) ran out, while the node still ran them: those
    // runs were stopped at their next commit.
    EXPECT_GT(r.faults[0].last_resume_s, 3.0);
    EXPECT_GT(r.fenced_writes, 0);
    EXPECT_EQ(r.sessions_stranded, 0);
}

// One cell of 3 nodes and these faults, all on node 1.
Scenario overlapping(const std::string & faults) {
    std::string err;
    auto s = parse_scenario(R"(
cells: 1
nodes_per_cell: 3
duration_s: 120
node: {sessions: 16}
tenants:
  - {name: a, rate_per_s: 1, steps: 8, tool_ms: 500, think_ms: 1000, initial: 24}
faults: [)" + faults + "]\n",
                            err);
    EXPECT_TRUE(s) << err;
    return *s;
}

TEST(Sim, ANodeHungWhenItsPartitionHealsTakesItsLeaseOnlyWhenItWakes) {
    const auto r = run(overlapping("{kind: partition, at_s: 10, cell: 0, node: 1, for_s: 10},"
                                   "{kind: node_hang, at_s: 12, cell: 0, node: 1, for_s: 15}"),
                       {2, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    EXPECT_EQ(r.leases.at(20), 0);  // the heal: still hung, it cannot renew
    EXPECT_EQ(r.leases.at(27), 1);  // the wake
}

TEST(Sim, ANodeRestartedWhileCutOffRegistersOnlyWhenThePartitionHeals) {
    const auto r = run(overlapping("{kind: partition, at_s: 10, cell: 0, node: 1, for_s: 20},"
                                   "{kind: node_crash, at_s: 12, cell: 0, node: 1, for_s: 5}"),
                       {2, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    EXPECT_EQ(r.leases.at(17), 0);  // started again, but etcd is out of its reach
    EXPECT_EQ(r.leases.at(30), 1);  // the heal
}

TEST(Sim, ASlowDiskDuringAPartitionDoesNotCountItsSessionsAsResumed) {
    const auto r = run(overlapping("{kind: partition, at_s: 10, cell: 0, node: 1, for_s: 15},"
                                   "{kind: slow_disk, at_s: 10.5, cell: 0, node: 1, for_s: 3, ms: 1000}"),
                       {2, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    ASSERT_GE(r.faults.size(), 1u);
    EXPECT_GT(r.faults[0].sessions_hit, 0);
    EXPECT_EQ(r.faults[0].resumed, r.faults[0].sessions_hit);
    // Resumed on other nodes once the lease ran out (its last keepalive, at most 1 s before the
    // cut, + 3 s), not at the slow disk's start (0.5 s in).
    EXPECT_GT(r.faults[0].last_resume_s, 2.0);
}

TEST(Sim, KvPastTheNodesBudgetIsParkedAndItsStepsPayTheRestore) {
    std::string err;
    const std::string base = R"(
cells: 1
nodes_per_cell: 2
duration_s: 90
tenants:
  - {name: a, rate_per_s: 0.5, steps: 20, tool_ms: 500, think_ms: 500, initial: 24}
node: {sessions: 16, step_tokens: 32, tokens_per_s: 800, seq_tokens_per_s: 25, restore_ms: 3000, kv_base_tokens: 1300, kv_step_tokens: 100, kv_bytes_per_token: 6144, )";
    const auto roomy = parse_scenario(base + "kv_budget_mb: 100000}\n", err);
    const auto tight = parse_scenario(base + "kv_budget_mb: 48}\n", err);
    ASSERT_TRUE(roomy && tight) << err;
    const auto a = run(*roomy, {2, false}), b = run(*tight, {2, false});
    EXPECT_TRUE(b.violations.empty()) << b.violations.front().what;
    EXPECT_GT(a.kv_peak_ratio, 0.0);
    EXPECT_LT(a.kv_peak_ratio, 0.01);
    EXPECT_GT(b.kv_peak_ratio, 1.5);  // 12 sessions of 8 MB and more on a 48 MB budget
    // The same work, slower: each step restores its parked share first.
    EXPECT_LT(double(b.steps_in_slo) / double(b.steps), double(a.steps_in_slo) / double(a.steps));
    EXPECT_LT(b.steps, a.steps);
}

TEST(Sim, AFailoverWaitCountsInTheLatencyOfTheMovedSessionsNextStep) {
    std::string err;
    const std::string base = R"(
cells: 1
nodes_per_cell: 3
duration_s: 60
node: {sessions: 16, tokens_per_s: 800, seq_tokens_per_s: 25, step_tokens: 32}
tenants:
  - {name: a, rate_per_s: 0.2, steps: 20, tool_ms: 500, think_ms: 1000, initial: 30}
)";
    const auto calm = parse_scenario(base, err);
    const auto crash = parse_scenario(base + "faults: [{kind: node_crash, at_s: 10, cell: 0, node: 1}]\n", err);
    ASSERT_TRUE(calm && crash) << err;
    const auto a = run(*calm, {2, false}), b = run(*crash, {2, false});
    EXPECT_TRUE(b.violations.empty()) << b.violations.front().what;
    // Every step's model time is 1.3 s: within 2 s, and so is every first step of a new session
    // (placed at once).
    EXPECT_EQ(a.steps_in_slo, a.steps);
    // The crashed node's sessions wait out its lease (about 3 s) for a node: each of their next
    // steps is late.
    // (A session whose next step had not ended by the end of the run is not counted at all.)
    const int64_t late = b.steps - b.steps_in_slo, hit = b.faults[0].sessions_hit;
    ASSERT_GT(hit, 5);
    EXPECT_GE(late, hit * 9 / 10);
    EXPECT_LE(late, hit);  // only their first steps there
    // A hang stops its sessions where they are: their next steps wait it out, there or elsewhere.
    const auto hang = parse_scenario(base + "faults: [{kind: node_hang, at_s: 10, cell: 0, node: 1, for_s: 8}]\n", err);
    ASSERT_TRUE(hang) << err;
    const auto c = run(*hang, {2, false});
    EXPECT_TRUE(c.violations.empty()) << c.violations.front().what;
    ASSERT_GT(c.faults[0].sessions_hit, 5);
    EXPECT_GE(c.steps - c.steps_in_slo, c.faults[0].sessions_hit * 9 / 10);
}

TEST(Sim, TheToolTimeDistributionIsTheScenariosChoice) {
    Scenario s = small();
    std::set<uint64_t> hashes;
    for (const char * d : {"exponential", "uniform", "constant"}) {
        for (auto & t : s.tenants)
            t.tool_dist = d;
        const auto r = run(s, {1, false});
        EXPECT_TRUE(r.violations.empty()) << d << ": " << r.violations.front().what;
        hashes.insert(r.trace_hash);
    }
    EXPECT_EQ(hashes.size(), 3u);  // each draws other tool times, so each is another run
}

TEST(Sim, APartitionShorterThanTheLeaseMovesNothing) {
    const auto r = run(partitioned(1), {4, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    EXPECT_GT(r.faults[0].sessions_hit, 0);
    EXPECT_EQ(r.faults[0].resumed, r.faults[0].sessions_hit);
    EXPECT_EQ(r.fenced_writes, 0);
    EXPECT_EQ(r.faults[0].peak_moves_per_s, 0);
}

TEST(Sim, ASlowDiskSlowsTheNodesStepsForItsTime) {
    std::string err;
    const std::string base = R"(
cells: 1
nodes_per_cell: 2
duration_s: 60
node: {sessions: 16, tokens_per_s: 800, seq_tokens_per_s: 25, step_tokens: 32}
tenants:
  - {name: a, rate_per_s: 1, steps: 8, tool_ms: 500, think_ms: 1000, initial: 20}
)";
    const auto fast = parse_scenario(base, err);
    const auto slow =
        parse_scenario(base + "faults: [{kind: slow_disk, at_s: 5, cell: 0, node: 0, for_s: 30, ms: 3000}]\n", err);
    ASSERT_TRUE(fast && slow) << err;
    const auto a = run(*fast, {2, false}), b = run(*slow, {2, false});
    EXPECT_TRUE(b.violations.empty()) << b.violations.front().what;
    const double slo_a = double(a.steps_in_slo) / double(a.steps), slo_b = double(b.steps_in_slo) / double(b.steps);
    EXPECT_EQ(slo_a, 1.0);
    EXPECT_LT(slo_b, 0.9) << b.steps_in_slo << " of " << b.steps;
    EXPECT_LT(b.steps, a.steps);
}

// 4 cells of 4 nodes, sessions running throughout; the real Rollout upgrades them in waves of
// 25%, one node per cell at a time. The simulator carries out its restarts as `cluster up` does:
// drain (the cell brain moves sessions between steps), exit, start on the new version.
const char * kRollout = R"(
name: rollout
cells: 4
nodes_per_cell: 4
duration_s: 400
node: {sessions: 16, tokens_per_s: 55, seq_tokens_per_s: 20, step_tokens: 32, restore_ms: 150, cores: 2}
tenants:
  - {name: acme, rate_per_s: 2, steps: 6, tool_ms: 1000, think_ms: 2000, initial: 60}
  - {name: globex, rate_per_s: 1, steps: 4, tool_ms: 800, initial: 20}
rollout:
  at_s: 20
  wave_percent: 25
  max_per_cell: 1
  settle_s: 10
  restarts_per_s: 2
  restart_s: 4
  jitter_s: 1
  drain_timeout_s: 30
)";

//! With `bad`, the new version fails every model step, and the wave settles for 30 s: time for
//! the 30 steps on the wave that the error gate needs to judge.
Scenario rollout_scenario(bool bad) {
    std::string err;
    auto s = parse_scenario(std::string(kRollout) + (bad ? "  bad: true\n" : ""), err);
    EXPECT_TRUE(s) << err;
    if (bad) s->rollout.settle_s = 30;
    return *s;
}

TEST(Sim, ARolloutUpgradesEveryNodeInWavesWithNoSessionLost) {
    const Scenario s = rollout_scenario(false);
    const auto r = run(s, {5, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    ASSERT_TRUE(r.rollout.ran);
    EXPECT_EQ(r.rollout.phase, "done") << r.rollout.fired;
    EXPECT_EQ(r.rollout.waves, 4);  // 25% of 16 nodes is 4, one per cell
    EXPECT_EQ(r.rollout.restarts, 16);
    EXPECT_EQ(r.rollout.nodes_on_new, 16);
    // Drains moved sessions away between steps; none waited for the drain timeout.
    EXPECT_GT(r.rollout.drain_moves, 0);
    EXPECT_EQ(r.rollout.failed_over, 0);
    EXPECT_EQ(run(s, {5, false}).trace_hash, r.trace_hash);
}

TEST(Sim, SessionsADrainLeavesAtItsTimeoutFailOverAndAreResumed) {
    Scenario s = rollout_scenario(false);
    s.rollout.drain_timeout_s = 1;  // shorter than a step: most sessions are still there
    const auto r = run(s, {5, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    EXPECT_EQ(r.rollout.phase, "done") << r.rollout.fired;
    EXPECT_GT(r.rollout.failed_over, 0);
    ASSERT_EQ(r.faults.size(), 1u);
    EXPECT_EQ(r.faults[0].what, "rollout drain timeouts");
    EXPECT_EQ(r.faults[0].sessions_hit, r.rollout.failed_over);
    EXPECT_EQ(r.faults[0].resumed, r.faults[0].sessions_hit);
}

TEST(Sim, ARolloutToABadVersionHaltsAfterItsFirstWaveAndRollsItBack) {
    const auto r = run(rollout_scenario(true), {5, false});
    EXPECT_TRUE(r.violations.empty()) << r.violations.front().what;
    EXPECT_EQ(r.rollout.phase, "halted");
    EXPECT_EQ(r.rollout.waves, 1);
    EXPECT_NE(r.rollout.fired.find("error_codes (model) fired"), std::string::npos) << r.rollout.fired;
    EXPECT_EQ(r.rollout.restarts, 8);  // the wave's 4 nodes, there and back
    EXPECT_EQ(r.rollout.nodes_on_new, 0);
    // Sessions that ended on the bad version are broken chains, and the good run has none.
    EXPECT_GT(r.sessions_failed, 0);
    EXPECT_EQ(run(rollout_scenario(false), {5, false}).sessions_failed, 0);
}

}  // namespace
}  // namespace armada::sim

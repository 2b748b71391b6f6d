// The global brain's decisions, one test each. Like the cell brain it is pure: reports and times
// in, shares and re-homes out.
#include "cluster/global_brain.h"
#include "cluster/membership.h"

#include <gtest/gtest.h>

using namespace armada::cluster;

namespace {

CellReport cell(const std::string & name, int capacity, int live, std::map<std::string, int> by_tenant = {},
                double step_ms = 0) {
    CellReport r;
    r.cell = name;
    r.nodes = 2;
    r.capacity = capacity;
    r.live_sessions = live;
    r.free_seqs = capacity - live;
    r.kv_headroom = 1ll << 30;
    r.step_ms = step_ms;
    r.by_tenant = std::move(by_tenant);
    return r;
}

std::vector<CellSpec> specs(std::initializer_list<std::pair<const char *, const char *>> cells, double water = 0.5) {
    std::vector<CellSpec> out;
    for (const auto & [name, domain] : cells)
        out.push_back({name, domain, water});
    return out;
}

}  // namespace

TEST(GlobalBrain, NewSessionsAreSplitByEachCellsRoomBelowItsWaterLevel) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}));
    g.report(cell("a", 100, 10), 0);  // room 50 - 10 = 40
    g.report(cell("b", 100, 40), 0);  // room 10
    const auto s = g.shares(0);
    ASSERT_EQ(s.weight.size(), 2u);
    EXPECT_DOUBLE_EQ(s.weight.at("a"), 0.8);
    EXPECT_DOUBLE_EQ(s.weight.at("b"), 0.2);
}

TEST(GlobalBrain, ACellAtItsWaterLevelGetsNoNewSessions) {
    GlobalBrain g({{"a", "", 0.57}, {"b", "", 0.57}});
    g.report(cell("a", 100, 57), 0);  // at 57%: full, though 43 slots are free
    g.report(cell("b", 100, 90), 0);
    EXPECT_TRUE(g.shares(0).weight.empty());
    EXPECT_EQ(pick_cell(g.shares(0), "t1"), "");
    // Both are named full, so a gateway falling back to room sends them nothing either.
    EXPECT_EQ(g.shares(0).full, (std::set<std::string>{"a", "b"}));
    g.report(cell("a", 100, 50), 1);
    EXPECT_EQ(g.shares(1).weight, (std::map<std::string, double>{{"a", 1.0}}));
    EXPECT_EQ(g.shares(1).full, (std::set<std::string>{"b"}));
    // A lost cell is not full: it is not there (its sessions are re-homed).
    g.leases_gone("b");
    EXPECT_TRUE(g.shares(1).full.empty());
}

TEST(GlobalBrain, ACellUnderKvPressureGetsNoNewSessions) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}));
    auto a = cell("a", 100, 0);
    a.kv_headroom = 0;
    g.report(a, 0);
    g.report(cell("b", 100, 0), 0);
    EXPECT_EQ(g.shares(0).weight, (std::map<std::string, double>{{"b", 1.0}}));
}

TEST(GlobalBrain, ACellWhoseStepsAreSlowGetsLessInProportion) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}, {"c", ""}}));
    g.report(cell("a", 100, 0, {}, 100), 0);
    g.report(cell("b", 100, 0, {}, 100), 0);
    g.report(cell("c", 100, 0, {}, 200), 0);  // twice as slow: half the weight
    const auto s = g.shares(0);
    EXPECT_DOUBLE_EQ(s.weight.at("a"), 0.4);
    EXPECT_DOUBLE_EQ(s.weight.at("c"), 0.2);
}

TEST(GlobalBrain, ACellWithFewerCoresForItsSessionsGetsLessInProportion) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}, {"c", ""}}));
    auto with_cores = [](CellReport r, int cores) {
        r.cores = cores;
        return r;
    };
    g.report(with_cores(cell("a", 100, 0), 64), 0);  // 0.64 cores per session it can hold
    g.report(with_cores(cell("b", 100, 0), 64), 0);
    g.report(with_cores(cell("c", 100, 0), 32), 0);  // half the typical: half the weight
    auto s = g.shares(0);
    EXPECT_DOUBLE_EQ(s.weight.at("a") / s.weight.at("c"), 2.0);
    EXPECT_DOUBLE_EQ(s.weight.at("a"), s.weight.at("b"));
    // A cell that reports no cores (an older node) is taken at its room alone.
    g.report(with_cores(cell("c", 100, 0), 0), 1);
    s = g.shares(1);
    EXPECT_DOUBLE_EQ(s.weight.at("a"), s.weight.at("c"));
}

TEST(GlobalBrain, ATenantsNewSessionsStayInItsCellUntilItsWaterLevel) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}));
    g.report(cell("a", 100, 30, {{"t1", 30}}), 0);
    g.report(cell("b", 100, 2, {{"t1", 2}, {"t2", 2}}), 0);
    auto s = g.shares(0);
    EXPECT_EQ(pick_cell(s, "t1"), "a");  // though b has more room
    EXPECT_EQ(pick_cell(s, "t2"), "b");
    // a reaches its water level: t1 goes where it has its other sessions.
    g.report(cell("a", 100, 50, {{"t1", 50}}), 1);
    s = g.shares(1);
    EXPECT_EQ(s.tenant_home.at("t1"), "b");
    EXPECT_EQ(pick_cell(s, "t1"), "b");
}

TEST(GlobalBrain, ATenantNewToTheClusterGetsTheSameCellFromEveryGatewayInProportionToTheWeights) {
    Shares s;
    s.weight = {{"a", 0.75}, {"b", 0.25}};
    int on_a = 0;
    for (int i = 0; i < 10000; ++i) {
        const std::string t = "tenant-" + std::to_string(i);
        const std::string c = pick_cell(s, t);
        EXPECT_EQ(c, pick_cell(s, t));  // another gateway, the same answer
        on_a += c == "a";
    }
    EXPECT_GT(on_a, 7200);
    EXPECT_LT(on_a, 7800);
    // A cell that fills up moves only its own tenants.
    Shares without_b;
    without_b.weight = {{"a", 1.0}};
    for (int i = 0; i < 200; ++i) {
        const std::string t = "tenant-" + std::to_string(i);
        if (pick_cell(s, t) == "a") EXPECT_EQ(pick_cell(without_b, t), "a");
    }
}

TEST(GlobalBrain, ACellIsLostWhenItsReportsStopOrAtOnceWhenItsLeasesAreGone) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}), {.report_ttl_ms = 10000});
    g.report(cell("a", 100, 0), 0);
    g.report(cell("b", 100, 0), 0);
    EXPECT_FALSE(g.lost("a", 10000));
    EXPECT_TRUE(g.lost("a", 10001));
    g.report(cell("a", 100, 0), 10001);
    EXPECT_FALSE(g.lost("a", 10002));
    g.leases_gone("b");
    EXPECT_TRUE(g.lost("b", 10002));
    EXPECT_EQ(g.lost_cells(10002), std::vector<std::string>{"b"});
    EXPECT_EQ(g.shares(10002).weight, (std::map<std::string, double>{{"a", 1.0}}));
    g.report(cell("b", 100, 0), 10003);  // back
    EXPECT_FALSE(g.lost("b", 10003));
}

TEST(GlobalBrain, ALostCellsSessionsAreRehomedUnderAHigherEpochNeverToItself) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}));
    g.report(cell("a", 100, 2), 0);
    g.report(cell("b", 100, 0), 0);
    g.leases_gone("a");
    g.open_in("a", {{"s1", "t1", 3}, {"s2", "t1", 1}});
    const auto d = g.decide(0);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0], (Rehome{"s1", "a", "b", 4}));
    EXPECT_EQ(d[1], (Rehome{"s2", "a", "b", 2}));
    EXPECT_EQ(g.waiting(), 0u);
}

TEST(GlobalBrain, NoCellIsRehomedWhileItLives) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}));
    g.report(cell("a", 100, 2), 0);
    g.report(cell("b", 100, 0), 0);
    g.open_in("a", {{"s1", "t1", 1}});
    EXPECT_TRUE(g.decide(0).empty());
}

TEST(GlobalBrain, RehomingPrefersAnotherFaultDomain) {
    GlobalBrain g(specs({{"a", "room1"}, {"b", "room1"}, {"c", "room2"}}));
    g.report(cell("a", 100, 0), 0);
    g.report(cell("b", 100, 0), 0);   // more room, but the same room as a
    g.report(cell("c", 100, 40), 0);  // room 10
    g.leases_gone("a");
    g.open_in("a", {{"s1", "t1", 1}});
    const auto d = g.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].to, "c");
}

TEST(GlobalBrain, RehomingKeepsATenantWithItsOtherSessions) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}, {"c", ""}}));
    g.report(cell("a", 100, 0), 0);
    g.report(cell("b", 100, 0), 0);
    g.report(cell("c", 100, 20, {{"t9", 20}}), 0);  // less room, but t9 lives there
    g.leases_gone("a");
    g.open_in("a", {{"s1", "t9", 1}, {"s2", "t1", 1}});
    const auto d = g.decide(0);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0], (Rehome{"s1", "a", "c", 2}));
    EXPECT_EQ(d[1].to, "b");
}

TEST(GlobalBrain, RehomingIsRateLimited) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}), {.rehomes_per_s = 10, .burst = 5});
    g.report(cell("a", 1000, 0), 0);
    g.report(cell("b", 1000, 0), 0);
    g.leases_gone("a");
    std::vector<GlobalBrain::OpenSession> open;
    for (int i = 0; i < 20; ++i)
        open.push_back({"s" + std::to_string(100 + i), "t", 1});
    g.open_in("a", open);
    EXPECT_EQ(g.decide(0).size(), 5u);    // the burst
    EXPECT_EQ(g.decide(100).size(), 1u);  // then 10 a second
    EXPECT_EQ(g.decide(1100).size(), 5u);
    EXPECT_EQ(g.waiting(), 9u);
}

TEST(GlobalBrain, EachCellThatTakesRehomesHasItsOwnPace) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}, {"c", ""}}), {.rehomes_per_s = 10, .burst = 5});
    for (const char * c : {"a", "b", "c"})
        g.report(cell(c, 1000, 0), 0);
    g.leases_gone("a");
    std::vector<GlobalBrain::OpenSession> open;
    for (int i = 0; i < 30; ++i)
        open.push_back({"s" + std::to_string(100 + i), "t" + std::to_string(i), 1});
    g.open_in("a", open);
    const auto first = g.decide(0);
    ASSERT_EQ(first.size(), 10u);  // a burst of 5 into each of the two others
    std::map<std::string, int> into;
    for (const auto & r : first)
        ++into[r.to];
    EXPECT_EQ(into, (std::map<std::string, int>{{"b", 5}, {"c", 5}}));
    EXPECT_EQ(g.decide(500).size(), 10u);  // then 10 a second into each
    EXPECT_EQ(g.waiting(), 10u);
}

TEST(GlobalBrain, RehomingFillsTheOtherCellsHeadroomAboveWaterUpToCapacity) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}));
    g.report(cell("a", 100, 0), 0);
    g.report(cell("b", 10, 7), 0);  // above its water level (5): no new sessions, 3 to spare
    EXPECT_TRUE(g.shares(0).full.count("b"));
    g.leases_gone("a");
    g.open_in("a", {{"s1", "t", 1}, {"s2", "t", 1}, {"s3", "t", 1}, {"s4", "t", 1}});
    EXPECT_EQ(g.decide(0).size(), 3u);
    EXPECT_EQ(g.waiting(), 1u);
    EXPECT_TRUE(g.decide(1).empty());  // full: the last one waits
    g.report(cell("b", 10, 9), 2);     // a session there ended: room for one
    EXPECT_EQ(g.decide(2).size(), 1u);
}

TEST(GlobalBrain, ARehomeDecidedIsNotDecidedAgainWhenTheStoreStillListsIt) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}));
    g.report(cell("a", 100, 0), 0);
    g.report(cell("b", 100, 0), 0);
    g.leases_gone("a");
    g.open_in("a", {{"s1", "t", 1}});
    ASSERT_EQ(g.decide(0).size(), 1u);
    g.open_in("a", {{"s1", "t", 1}});  // read before the write landed
    EXPECT_TRUE(g.decide(1).empty());
    g.rehome_done("s1");
    g.open_in("a", {});
    EXPECT_TRUE(g.decide(2).empty());
}

TEST(GlobalBrain, ACellThatComesBackKeepsWhatWasNotHandedOver) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}), {.rehomes_per_s = 0, .burst = 1});
    g.report(cell("a", 100, 0), 0);
    g.report(cell("b", 100, 0), 0);
    g.leases_gone("a");
    g.open_in("a", {{"s1", "t", 1}, {"s2", "t", 1}});
    ASSERT_EQ(g.decide(0).size(), 1u);
    g.report(cell("a", 100, 1), 1);
    EXPECT_EQ(g.waiting(), 0u);
    EXPECT_TRUE(g.decide(2).empty());
}

TEST(GlobalBrain, ReportsOfCellsNotInTheConfigAreIgnored) {
    GlobalBrain g(specs({{"a", ""}}));
    g.report(cell("x", 100, 0), 0);
    EXPECT_EQ(g.shares(0).weight, (std::map<std::string, double>{}));
}

TEST(GlobalBrain, ReportsAndSharesRoundTripThroughEtcdAndBadOnesAreRefused) {
    const auto r = cell("a", 100, 30, {{"t1", 30}}, 120.5);
    const auto back = decode_cell_report("a", encode_cell_report(r));
    ASSERT_TRUE(back);
    EXPECT_EQ(back->capacity, 100);
    EXPECT_EQ(back->live_sessions, 30);
    EXPECT_EQ(back->by_tenant, r.by_tenant);
    EXPECT_DOUBLE_EQ(back->step_ms, 120.5);
    EXPECT_FALSE(decode_cell_report("a", "{\"capacity\":\"lots\"}"));
    EXPECT_FALSE(decode_cell_report("a", "{\"capacity\":-1}"));
    EXPECT_FALSE(decode_cell_report("a", "[]"));
    Shares s;
    s.weight = {{"a", 0.25}, {"b", 0.75}};
    s.tenant_home = {{"t1", "b"}};
    s.full = {"c"};
    EXPECT_EQ(decode_shares(encode_shares(s)), s);
    EXPECT_EQ(decode_shares("{\"weight\":{\"a\":1}}")->full, std::set<std::string>{});  // an older leader's split
    EXPECT_FALSE(decode_shares("{\"weight\":{\"a\":-1}}"));
    EXPECT_FALSE(decode_shares("{\"weight\":[1]}"));
}

TEST(CellReport, SumsTheNodesAndLeavesADrainingNodesRoomOut) {
    NodeLoad a;
    a.node = "a";
    a.free_seqs = 6;
    a.sessions = 2;
    a.cores = 4;
    a.kv_headroom = 100;
    a.kv_budget = 400;
    a.step_ms = 50;
    NodeLoad b = a;
    b.node = "b";
    b.sessions = 0;
    b.step_ms = 110;
    NodeLoad d = a;
    d.node = "d";
    d.draining = true;
    d.sessions = 5;
    d.step_ms = 0;  // not known: left out of the latency
    const auto r = cell_report("c", {a, b, d}, {{"t1", 7}});
    EXPECT_EQ(r.cell, "c");
    EXPECT_EQ(r.nodes, 3);
    EXPECT_EQ(r.cores, 12);
    EXPECT_EQ(r.live_sessions, 7);
    EXPECT_EQ(r.capacity, 14);  // a: 6 + 2, b: 6 + 0; the draining node takes nothing
    EXPECT_EQ(r.free_seqs, 12);
    EXPECT_EQ(r.kv_headroom, 200);
    EXPECT_EQ(r.kv_budget, 800);  // the draining node's KV is not room for new sessions
    EXPECT_EQ(decode_cell_report("c", encode_cell_report(r))->kv_budget, 800);
    EXPECT_DOUBLE_EQ(r.step_ms, (50.0 * 3 + 110.0 * 1) / 4);  // weighted by sessions + 1
    EXPECT_EQ(r.by_tenant, (std::map<std::string, int>{{"t1", 7}}));
}

TEST(GlobalBrain, SessionsQueuedInACellTakeItsRoomForNewAndRehomedSessions) {
    GlobalBrain g(specs({{"a", ""}, {"b", ""}, {"c", ""}}));
    auto b = cell("b", 100, 20);  // water 50: room for 30 by its running sessions alone
    b.queued = 40;                // but 40 wait in its brain for room
    g.report(cell("a", 100, 0), 0);
    g.report(b, 0);
    g.report(cell("c", 100, 90), 0);
    EXPECT_TRUE(g.shares(0).full.count("b"));
    g.leases_gone("a");
    std::vector<GlobalBrain::OpenSession> open;
    for (int i = 0; i < 60; ++i)
        open.push_back({"s" + std::to_string(i), "t", 1});
    g.open_in("a", open);
    // b can take 100 - 20 - 40 = 40, c 100 - 90 = 10: the rest wait.
    EXPECT_EQ(g.decide(0).size(), 50u);
    EXPECT_EQ(g.waiting(), 10u);
    const auto back = decode_cell_report("b", encode_cell_report(b));
    ASSERT_TRUE(back);
    EXPECT_EQ(back->queued, 40);
}

TEST(GlobalBrain, ACellThatStopsReportingWhileItsNodesLeasesLiveIsSilentNotLost) {
    // Its brains are stuck (a dependency that hangs) or cut off from etcd, but its nodes still
    // hold their leases and run their sessions: re-homing them would fence live work.
    GlobalBrain g(specs({{"a", ""}, {"b", ""}}), {.report_ttl_ms = 10000});
    g.report(cell("a", 100, 2), 0);
    g.report(cell("b", 100, 0), 0);
    g.node_leases("a", 3);
    g.report(cell("b", 100, 0), 20000);
    EXPECT_TRUE(g.stale("a", 20000));
    EXPECT_FALSE(g.lost("a", 20000));
    EXPECT_TRUE(g.lost_cells(20000).empty());
    g.open_in("a", {{"s1", "t1", 1}, {"s2", "t2", 4}});
    EXPECT_TRUE(g.decide(20000).empty()) << "nothing is re-homed while the cell's nodes live";
    // Nor does it get new sessions, and it is not counted full.
    const Shares s = g.shares(20000);
    EXPECT_EQ(s.weight, (std::map<std::string, double>{{"b", 1.0}}));
    EXPECT_FALSE(s.full.count("a"));
    // Its nodes' leases go: now it is lost, and its sessions go elsewhere.
    g.node_leases("a", 0);
    EXPECT_TRUE(g.lost("a", 20001));
    EXPECT_EQ(g.decide(20001).size(), 2u);
}

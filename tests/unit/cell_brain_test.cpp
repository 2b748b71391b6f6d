// The cell brain's decisions, one test each. The brain is pure: events and times in, decisions out.
#include "cluster/cell_brain.h"

#include <gtest/gtest.h>

using namespace armada::cluster;

namespace {

NodeLoad report(const std::string & node, int free, int64_t kv = 1 << 30, bool draining = false) {
    NodeLoad l;
    l.node = node;
    l.free_seqs = free;
    l.kv_headroom = kv;
    l.draining = draining;
    return l;
}

CellBrain with_nodes(std::initializer_list<NodeLoad> loads, int64_t now = 0, CellBrainConfig cfg = {}) {
    CellBrain b(cfg);
    for (const auto & l : loads) {
        b.node_up(l.node);
        b.load(l, now);
    }
    return b;
}

}  // namespace

TEST(CellBrain, PlacesOnTheNodeWithTheMostFreeSequencesThenTheMostKvHeadroom) {
    auto b = with_nodes({report("n1", 4), report("n2", 9), report("n3", 9, 2ll << 30)});
    b.session_open("s1", "", 0);
    const auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s1", "n3", 1, false}));
    EXPECT_EQ(b.live_nodes(), (std::vector<std::string>{"n1", "n2", "n3"}));
    b.node_down("n2");
    EXPECT_EQ(b.live_nodes(), (std::vector<std::string>{"n1", "n3"}));
}

TEST(CellBrain, CountsWhatItPlacedSinceANodesLastReport) {
    auto b = with_nodes({report("n1", 2), report("n2", 1)});
    for (const char * s : {"s1", "s2", "s3", "s4"})
        b.session_open(s, "", 0);
    const auto d = b.decide(0);
    ASSERT_EQ(d.size(), 3u);  // 2 + 1 free: the fourth waits
    EXPECT_EQ(b.sessions_on("n1"), 2u);
    EXPECT_EQ(b.sessions_on("n2"), 1u);
    EXPECT_EQ(b.waiting(), 1u);
    // A report right after the placements may not show them (their run commands may still be on
    // the way): they still count against its room.
    b.load(report("n2", 1), 100);
    EXPECT_TRUE(b.decide(100).empty());
    // A report a settling time later that still does not count s3 leaves no room either: its
    // run command has not arrived (NATS out, say).
    b.load(report("n2", 1), 1500);
    EXPECT_TRUE(b.decide(1500).empty());
    // One that runs it, with a sequence freed since: room again.
    auto shows = report("n2", 1);
    shows.sessions = 1;
    b.load(shows, 1600);
    const auto d2 = b.decide(1600);
    ASSERT_EQ(d2.size(), 1u);
    EXPECT_EQ(d2[0].session, "s4");
    EXPECT_EQ(d2[0].node, "n2");
}

TEST(CellBrain, PlacementsANodesReportsDoNotCountYetKeepCountingAgainstItPastTheSettlingTime) {
    // NATS was out: two sessions placed on n1 long ago never reached it, and its reports, fresh
    // and with room, still show one session. Only its room less the one it has not taken is free.
    auto b = with_nodes({report("n1", 4)});
    b.session_open("a", "n1", 3);
    b.session_open("b", "n1", 3);
    auto r = report("n1", 3);
    r.sessions = 1;
    r.seq = 7;
    b.load(r, 60000);
    for (const char * s : {"s1", "s2", "s3"})
        b.session_open(s, "", 0);
    const auto d = b.decide(60000);
    ASSERT_EQ(d.size(), 2u);  // 3 free less the 1 not taken yet
    EXPECT_EQ(b.waiting(), 1u);
    // It ends one of them (closed) and reports the other: the count is right again.
    b.session_closed("b");
    r.sessions = 3;  // a, s1, s2
    r.free_seqs = 1;
    r.seq = 8;
    b.load(r, 62000);
    ASSERT_EQ(b.decide(62000).size(), 1u);
    EXPECT_EQ(b.waiting(), 0u);
}

TEST(CellBrain, APlacementThatWasNotWrittenNoLongerCountsAgainstItsNode) {
    auto b = with_nodes({report("n1", 1)});
    b.session_open("s1", "", 0);
    ASSERT_EQ(b.decide(0).size(), 1u);
    b.place_failed("s1");  // the store refused it (or could not be reached)
    auto r = report("n1", 1);
    r.seq = 2;
    b.load(r, 1500);
    b.session_open("s2", "", 0);
    const auto d = b.decide(1500);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].session, "s2");
    EXPECT_EQ(d[0].node, "n1");
}

TEST(CellBrain, TheSameReportReadAgainDoesNotGiveRoomAgain) {
    CellBrain b;
    b.node_up("n1");
    auto r = report("n1", 2);
    r.seq = 41;
    b.load(r, 0);
    for (const char * s : {"s1", "s2", "s3"})
        b.session_open(s, "", 0);
    ASSERT_EQ(b.decide(0).size(), 2u);
    // A reconcile reads the node's key again, long after: the report it finds is the one whose
    // room was used.
    b.load(r, 5000);
    EXPECT_TRUE(b.decide(5000).empty());
    r.seq = 42;
    r.free_seqs = 1;
    r.sessions = 2;  // s1 and s2, and one sequence freed
    b.load(r, 5100);
    EXPECT_EQ(b.decide(5100).size(), 1u);
}

TEST(CellBrain, NeverPlacesOnADrainingNode) {
    auto b = with_nodes({report("n1", 50, 1 << 30, true), report("n2", 1)});
    b.session_open("s1", "", 0);
    b.session_open("s2", "", 0);
    const auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].node, "n2");
    EXPECT_EQ(b.waiting(), 1u);
}

TEST(CellBrain, ADrainEventStopsPlacementBeforeTheNextReportAndAReportUndoesIt) {
    auto b = with_nodes({report("n1", 50), report("n2", 1)});
    b.node_draining("n1");
    b.session_open("s1", "", 0);
    b.session_open("s2", "", 0);
    auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].node, "n2");
    // The node restarted and reports that it takes work again.
    b.load(report("n1", 50), 100);
    d = b.decide(100);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s2", "n1", 1, false}));
}

TEST(CellBrain, ASessionThatEndedIsNotMovedWhenItsNodeDies) {
    auto b = with_nodes({report("n1", 10), report("n2", 10)});
    b.session_open("s1", "n1", 1);
    b.session_open("s2", "n1", 1);
    b.session_closed("s1");  // the node's "ended" event, before the next reconcile
    b.node_down("n1");
    const auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s2", "n2", 2, true, "", "n1"}));
}

TEST(CellBrain, NeverPlacesOnANodeWhoseLeaseIsGone) {
    CellBrain b;
    b.load(report("ghost", 50), 0);  // a report without a lease does not make a node live
    b.node_up("n1");
    b.load(report("n1", 50), 0);
    b.node_down("n1");
    b.session_open("s1", "", 0);
    EXPECT_TRUE(b.decide(0).empty());
    EXPECT_FALSE(b.live("ghost"));
    EXPECT_EQ(b.waiting(), 1u);
}

TEST(CellBrain, NeverTrustsAStaleReport) {
    CellBrainConfig cfg;
    cfg.report_ttl_ms = 5000;
    auto b = with_nodes({report("hung", 50), report("n2", 1)}, 0, cfg);
    b.load(report("n2", 1), 9000);
    b.session_open("s1", "", 0);
    const auto d = b.decide(9000);  // "hung" last reported 9 s ago
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].node, "n2");
}

TEST(CellBrain, KeepsASessionOnItsNodeWhileThatNodeLives) {
    auto b = with_nodes({report("n1", 0), report("n2", 60)});
    b.session_open("s1", "n1", 3);
    EXPECT_TRUE(b.decide(0).empty());  // n2 has more room, but n1 holds it and lives
    EXPECT_EQ(b.node_of("s1"), "n1");
}

TEST(CellBrain, ADeadNodesSessionsMoveUnderANewEpoch) {
    auto b = with_nodes({report("n1", 10), report("n2", 10)});
    b.session_open("s1", "n1", 4);
    b.session_open("s2", "n2", 1);
    b.node_down("n1");
    const auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s1", "n2", 5, true, "", "n1"}));
    EXPECT_TRUE(b.decide(0).empty());  // decided once, not again
}

TEST(CellBrain, MassReplacementIsRateLimited) {
    CellBrainConfig cfg;
    cfg.moves_per_s = 200;
    cfg.burst = 100;
    auto b = with_nodes({report("n1", 1000), report("n2", 1000)}, 0, cfg);
    for (int i = 0; i < 500; ++i)
        b.session_open("s" + std::to_string(i), "n1", 1);
    b.node_down("n1");
    EXPECT_EQ(b.decide(0).size(), 100u);  // the burst
    b.load(report("n2", 1000), 250);
    EXPECT_EQ(b.decide(250).size(), 50u);  // 200/s for 250 ms
    EXPECT_EQ(b.decide(250).size(), 0u);
    EXPECT_EQ(b.waiting(), 350u);
}

TEST(CellBrain, NewSessionsAreNotHeldBehindTheMoveLimit) {
    CellBrainConfig cfg;
    cfg.burst = 1;
    cfg.moves_per_s = 1;
    auto b = with_nodes({report("n1", 1000), report("n2", 1000)}, 0, cfg);
    b.session_open("old1", "n1", 1);
    b.session_open("old2", "n1", 1);
    b.node_down("n1");
    b.session_open("new1", "", 0);
    const auto d = b.decide(0);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].session, "old1");
    EXPECT_EQ(d[1].session, "new1");
}

TEST(CellBrain, WhenNoNodeHasRoomSessionsWaitAndGoInArrivalOrder) {
    auto b = with_nodes({report("n1", 0)});
    for (const char * s : {"zz", "aa", "mm"})
        b.session_open(s, "", 0);
    EXPECT_TRUE(b.decide(0).empty());
    b.load(report("n1", 2), 10);
    const auto d = b.decide(10);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].session, "zz");
    EXPECT_EQ(d[1].session, "aa");
}

TEST(CellBrain, AFailedPlacementWaitsForTheNextReconcile) {
    auto b = with_nodes({report("n1", 10)});
    b.session_open("s1", "", 0);
    ASSERT_EQ(b.decide(0).size(), 1u);
    b.place_failed("s1");  // someone else assigned it first
    b.node_down("n1");
    b.node_up("n2");
    b.load(report("n2", 10), 0);
    EXPECT_TRUE(b.decide(0).empty());  // held: the brain does not guess
    b.reconcile({"n2"}, {{"s1", "n1", 7}});
    const auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s1", "n2", 8, true, "", "n1"}));
}

TEST(CellBrain, AReconcileDoesNotUndoADecisionStillBeingWritten) {
    auto b = with_nodes({report("n1", 10), report("n2", 10)});
    b.session_open("s1", "", 0);
    ASSERT_EQ(b.decide(0).size(), 1u);
    // The store was read before the assignment landed: it still shows the session unplaced.
    b.reconcile({"n1", "n2"}, {{"s1", "", 0}});
    EXPECT_TRUE(b.decide(0).empty());  // no second placement
    b.place_done("s1");
    b.reconcile({"n1", "n2"}, {{"s1", "", 0}});  // confirmed, yet the store says otherwise: trust it
    EXPECT_EQ(b.decide(0).size(), 1u);
}

TEST(CellBrain, ALateOlderAssignmentNeverOverridesANewerOne) {
    auto b = with_nodes({report("n1", 10), report("n2", 10)});
    b.session_open("s1", "n2", 5);
    b.session_open("s1", "n1", 4);  // a late message
    EXPECT_EQ(b.node_of("s1"), "n2");
}

TEST(CellBrain, ReconcileDropsEndedSessionsAndDeadNodes) {
    auto b = with_nodes({report("n1", 10), report("n2", 10)});
    b.session_open("s1", "n1", 1);
    b.session_open("s2", "n1", 1);
    b.reconcile({"n2"}, {{"s2", "n1", 1}});
    EXPECT_FALSE(b.node_of("s1"));
    EXPECT_FALSE(b.live("n1"));
    const auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s2", "n2", 2, true, "", "n1"}));
}

TEST(CellBrain, ASessionOfferedByADrainingNodeMovesFromItWithItsKv) {
    auto b = with_nodes({report("n1", 10), report("n2", 10)});
    b.session_open("s1", "n1", 3);
    b.session_open("s2", "n1", 2);
    // Not draining, and reporting no KV budget: as a rebalance, no node has more room, so the
    // offer lapses.
    b.session_movable("s1", "n1", 3);
    EXPECT_TRUE(b.decide(0).empty());
    b.node_draining("n1");
    // An offer for an older epoch, or from another node, is stale.
    b.session_movable("s1", "n1", 2);
    b.session_movable("s1", "n2", 3);
    EXPECT_TRUE(b.decide(0).empty());
    b.session_movable("s1", "n1", 3);
    auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s1", "n2", 4, true, "n1", "n1"}));
    EXPECT_TRUE(b.decide(0).empty());  // decided once
    // s2 was never offered (busy on n1): it stays until it is.
    EXPECT_EQ(b.node_of("s2"), "n1");
}

TEST(CellBrain, AnOfferSurvivesAReconcileWhileTheSessionStaysPut) {
    auto b = with_nodes({report("n1", 10, 1 << 30, true), report("n2", 0)});
    b.session_open("s1", "n1", 3);
    b.session_movable("s1", "n1", 3);
    EXPECT_TRUE(b.decide(0).empty());  // no room anywhere yet
    b.reconcile({"n1", "n2"}, {{"s1", "n1", 3}});
    b.load(report("n2", 5), 10);
    auto d = b.decide(10);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s1", "n2", 4, true, "n1", "n1"}));
}

TEST(CellBrain, AnOfferIsDroppedWhenTheSessionMovedMeanwhile) {
    auto b = with_nodes({report("n1", 10, 1 << 30, true), report("n2", 0), report("n3", 0)});
    b.session_open("s1", "n1", 3);
    b.session_movable("s1", "n1", 3);
    // The store shows it elsewhere under a newer epoch (another leader moved it).
    b.reconcile({"n1", "n2", "n3"}, {{"s1", "n3", 4}});
    b.load(report("n2", 5), 10);
    EXPECT_TRUE(b.decide(10).empty());
    EXPECT_EQ(b.node_of("s1"), "n3");
}

TEST(CellBrain, ASessionOfADeadNodeMovesWithoutASourceToFetchFrom) {
    auto b = with_nodes({report("n1", 10, 1 << 30, true), report("n2", 10)});
    b.session_open("s1", "n1", 3);
    b.session_movable("s1", "n1", 3);
    b.node_down("n1");  // gone before the move was decided: its KV cannot come
    auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s1", "n2", 4, true, "", "n1"}));
}

namespace {
NodeLoad kv_report(const std::string & node, int free, int64_t headroom, int64_t budget) {
    NodeLoad l = report(node, free, headroom);
    l.kv_budget = budget;
    return l;
}
}  // namespace

TEST(CellBrain, ANodePastItsKvWatermarkRebalancesToANodeWithKvRoom) {
    // n1 has 5% of its KV left; n2 has more free sequences but 20% KV; n3 has 60% KV.
    auto b = with_nodes({kv_report("n1", 10, 5, 100), kv_report("n2", 30, 20, 100), kv_report("n3", 2, 60, 100)});
    b.session_open("s1", "n1", 1);
    b.session_movable("s1", "n1", 1);
    auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s1", "n3", 2, true, "n1", "n1"}));
}

TEST(CellBrain, ARebalanceOfferLapsesWhenNoNodeHasKvRoomAndHoldsNothingUp) {
    auto b = with_nodes({kv_report("n1", 10, 5, 100), kv_report("n2", 30, 20, 100)});
    b.session_open("s1", "n1", 1);
    b.session_movable("s1", "n1", 1);
    b.session_open("new", "", 0);  // arrives after the offer: still placed
    auto d = b.decide(0);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].session, "new");
    EXPECT_EQ(b.node_of("s1"), "n1");
    // Room appears later: the old offer is gone; a new one moves it.
    b.load(kv_report("n2", 30, 50, 100), 10);
    EXPECT_TRUE(b.decide(10).empty());
    b.session_movable("s1", "n1", 1);
    d = b.decide(10);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], (Place{"s1", "n2", 2, true, "n1", "n1"}));
}

TEST(CellBrain, ARebalanceGoesOnlyToANodeWithClearlyMoreKvFree) {
    // n2 has room (above 30% free), but not 20 points more than n1: the move would gain little.
    auto b = with_nodes({kv_report("n1", 10, 40, 100), kv_report("n2", 30, 55, 100)});
    b.session_open("s1", "n1", 1);
    b.session_movable("s1", "n1", 1);
    EXPECT_TRUE(b.decide(0).empty());
    EXPECT_EQ(b.node_of("s1"), "n1");
}

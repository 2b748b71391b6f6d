// The cluster runners' shared parts: the key layout, the back-off, the in-memory key-value
// store, and the informer over it.

#include "cluster/runtime/clock.h"
#include "cluster/runtime/informer.h"
#include "cluster/runtime/keys.h"
#include "cluster/runtime/kv.h"
#include "common/backoff.h"

#include <gtest/gtest.h>

using namespace armada::cluster;
using K = ClusterKeys::Parsed::Kind;

TEST(ClusterKeys, EveryBuiltKeyParsesBackToWhatBuiltIt) {
    const ClusterKeys k("/armada");
    auto p = k.parse(k.node("eu-1", "n7"));
    EXPECT_EQ(p.kind, K::Node);
    EXPECT_EQ(p.cell, "eu-1");
    EXPECT_EQ(p.name, "n7");
    p = k.parse(k.cell_report("eu-1"));
    EXPECT_EQ(p.kind, K::CellReport);
    EXPECT_EQ(p.cell, "eu-1");
    EXPECT_EQ(k.parse(k.cell_election("c") + "/694d7a1b2c").kind, K::CellElection);
    p = k.parse(k.cell_failovers("c2"));
    EXPECT_EQ(p.kind, K::CellFailovers);
    EXPECT_EQ(p.cell, "c2");
    EXPECT_EQ(k.parse(k.global_election() + "/1").kind, K::GlobalElection);
    EXPECT_EQ(k.parse(k.shares()).kind, K::Shares);
    p = k.parse(k.gateway("host-1234"));
    EXPECT_EQ(p.kind, K::Gateway);
    EXPECT_EQ(p.name, "host-1234");
    EXPECT_EQ(k.parse(k.rollout_state()).kind, K::RolloutState);
    EXPECT_EQ(k.parse(k.rollout() + "spec").kind, K::RolloutSpec);
    EXPECT_EQ(k.parse(k.rollout() + "command").kind, K::RolloutCommand);
    p = k.parse(k.restart_request("n1"));
    EXPECT_EQ(p.kind, K::RestartRequest);
    EXPECT_EQ(p.name, "n1");
    p = k.parse(k.restart_ack("n1"));
    EXPECT_EQ(p.kind, K::RestartAck);
    EXPECT_EQ(p.name, "n1");
}

TEST(ClusterKeys, KeysOutsideTheLayoutOrWithBadNamesAreOther) {
    const ClusterKeys k("/armada");
    for (const char * key :
         {"/armada", "/armada/", "/armadax/cells/c/report", "/other/cells/c/report", "/armada/cells/c",
          "/armada/cells/c/", "/armada/cells//report", "/armada/cells/c/nodes/", "/armada/cells/c/nodes/a/b",
          "/armada/cells/c/nodes/bad name", "/armada/cells/c/reports", "/armada/failovers/", "/armada/gateways/",
          "/armada/gateways/a/b", "/armada/global/sharesx", "/armada/rollout/restart/", "/armada/cells/c\n/report"}) {
        EXPECT_EQ(k.parse(key).kind, K::Other) << key;
    }
    // A prefix that is itself a prefix of another's does not capture its keys.
    EXPECT_EQ(ClusterKeys("/a").parse("/ab/cells/c/report").kind, K::Other);
}

TEST(Backoff, DoublesWithJitterUpToItsCapAndStartsOverAfterASuccess) {
    armada::common::Backoff b(100, 800, 7);
    for (int base : {100, 200, 400, 800, 800}) {
        const int ms = b.next_ms();
        EXPECT_GE(ms, base / 2);
        EXPECT_LE(ms, base + base / 2);
    }
    b.reset();
    EXPECT_EQ(b.base_ms(), 100);
    // Two processes that failed together draw different pauses.
    armada::common::Backoff x(1000, 4000, 1), y(1000, 4000, 2);
    bool differ = false;
    for (int i = 0; i < 4; ++i)
        differ |= x.next_ms() != y.next_ms();
    EXPECT_TRUE(differ);
}

TEST(MemoryKv, KeepsEtcdsRevisionsLeasesAndTxnCompares) {
    MemoryKv kv;
    ASSERT_EQ(kv.put("/a", "1", 0), "");
    std::optional<EtcdKv> got;
    ASSERT_EQ(kv.get("/a", got), "");
    ASSERT_TRUE(got);
    const int64_t created = got->create_revision;
    ASSERT_EQ(kv.put("/a", "2", 0), "");
    ASSERT_EQ(kv.get("/a", got), "");
    EXPECT_EQ(got->create_revision, created);
    EXPECT_GT(got->mod_revision, created);
    EXPECT_NE(kv.put("/b", "x", 424242), "") << "a lease that does not exist";
    const int64_t lease = kv.grant();
    ASSERT_EQ(kv.put("/l/1", "x", lease), "");
    bool ok = false;
    int64_t rev = 0;
    ASSERT_EQ(kv.txn({{EtcdCompare::Target::Create, "/l/1", created}}, {{"/t", "v"}}, ok, rev), "");
    EXPECT_FALSE(ok);
    ASSERT_EQ(kv.get("/l/1", got), "");
    ASSERT_EQ(kv.txn({{EtcdCompare::Target::Create, "/l/1", got->create_revision}}, {{"/t", "v"}}, ok, rev), "");
    EXPECT_TRUE(ok);
    kv.revoke(lease);
    ASSERT_EQ(kv.get("/l/1", got), "");
    EXPECT_FALSE(got) << "a revoked lease takes its keys";
    kv.set_down(true);
    EXPECT_NE(kv.get("/a", got), "");
}

TEST(MemoryKv, PeriodicCompactionKeepsBetweenOneAndTwoPeriodsOfHistory) {
    ManualClock clock;
    MemoryKv kv(&clock);
    kv.set_retention(60000);
    const auto can_watch_from = [&](int64_t rev) {
        auto w = kv.watch("/p/", rev);
        std::vector<EtcdEvent> evs;
        std::string err;
        return w->take(evs, 0, err) || err.find("compacted") == std::string::npos;
    };
    ASSERT_EQ(kv.put("/p/a", "1", 0), "");
    const int64_t early = kv.revision();
    clock.advance(30000);
    kv.expire_leases();
    ASSERT_EQ(kv.put("/p/a", "2", 0), "");
    clock.advance(30000);  // one period: the history before the start goes, not `early`
    kv.expire_leases();
    EXPECT_TRUE(can_watch_from(early));
    ASSERT_EQ(kv.put("/p/a", "3", 0), "");
    const int64_t recent = kv.revision();
    clock.advance(60000);  // two periods: what came before the last mark goes
    kv.expire_leases();
    EXPECT_FALSE(can_watch_from(early));
    EXPECT_TRUE(can_watch_from(recent));
}

TEST(Informer, ListsWatchesAndAfterAnOutageHandsOutOnlyTheDifference) {
    MemoryKv kv;
    ManualClock clock;
    kv.put("/p/a", "1", 0);
    kv.put("/p/b", "1", 0);
    kv.put("/q/x", "1", 0);
    Informer inf(kv, "/p/", clock, 0, armada::common::Backoff(100, 400, 3));
    std::vector<EtcdEvent> ch;
    std::string err;
    ASSERT_TRUE(inf.poll(ch, 0, err)) << err;
    ASSERT_EQ(ch.size(), 2u);
    EXPECT_EQ(inf.view().size(), 2u);
    ch.clear();
    kv.put("/p/c", "1", 0);
    kv.put("/q/y", "1", 0);  // outside the prefix
    kv.erase("/p/a");
    ASSERT_TRUE(inf.poll(ch, 0, err));
    ASSERT_EQ(ch.size(), 2u);
    EXPECT_EQ(ch[0].type, EtcdEvent::Type::Put);
    EXPECT_EQ(ch[0].kv.key, "/p/c");
    EXPECT_EQ(ch[1].type, EtcdEvent::Type::Delete);
    EXPECT_EQ(ch[1].kv.key, "/p/a");

    // etcd goes away: the watch ends, the view stays, and the next list waits its back-off.
    kv.set_down(true);
    ch.clear();
    EXPECT_FALSE(inf.poll(ch, 0, err));
    EXPECT_NE(err.find("ended"), std::string::npos) << err;
    EXPECT_EQ(inf.view().size(), 2u);
    EXPECT_GT(inf.retry_in_ms(), 0);
    kv.set_down(false);
    kv.put("/p/d", "1", 0);  // missed by the watch
    kv.put("/p/b", "2", 0);  // changed
    kv.erase("/p/c");        // gone
    EXPECT_FALSE(inf.poll(ch, 0, err)) << "a retry before its back-off";
    const int64_t lists = inf.lists();
    clock.advance(inf.retry_in_ms());
    ASSERT_TRUE(inf.poll(ch, 0, err)) << err;
    EXPECT_EQ(inf.lists(), lists + 1);
    std::map<std::string, EtcdEvent::Type> seen;
    for (const auto & e : ch)
        seen[e.kv.key] = e.type;
    EXPECT_EQ(seen,
              (std::map<std::string, EtcdEvent::Type>{
                  {"/p/b", EtcdEvent::Type::Put}, {"/p/c", EtcdEvent::Type::Delete}, {"/p/d", EtcdEvent::Type::Put}}));
}

TEST(Informer, AWatchFromACompactedOrRestoredRevisionEndsAndTheViewIsListedAgain) {
    MemoryKv kv;
    ManualClock clock;
    kv.put("/p/a", "1", 0);
    const auto snap = kv.snapshot();
    Informer inf(kv, "/p/", clock, 0, armada::common::Backoff(100, 400, 3));
    std::vector<EtcdEvent> ch;
    std::string err;
    ASSERT_TRUE(inf.poll(ch, 0, err));
    kv.put("/p/b", "1", 0);
    kv.put("/p/c", "1", 0);
    ch.clear();
    ASSERT_TRUE(inf.poll(ch, 0, err));
    const int64_t high = inf.revision();
    // A restore to an earlier snapshot: the revision goes back, and b and c are gone.
    kv.restore(snap);
    EXPECT_LT(kv.revision(), high);
    ch.clear();
    EXPECT_FALSE(inf.poll(ch, 0, err));
    clock.advance(inf.retry_in_ms());
    ASSERT_TRUE(inf.poll(ch, 0, err)) << err;
    EXPECT_EQ(inf.view().size(), 1u);
    EXPECT_EQ(ch.size(), 2u);  // b and c deleted
    EXPECT_LT(inf.revision(), high) << "the view follows etcd back";
    // A watch asked to start before a compaction ends at once.
    kv.put("/p/z", "1", 0);
    kv.compact();
    auto w = kv.watch("/p/", 1);
    std::vector<EtcdEvent> evs;
    EXPECT_FALSE(w->take(evs, 0, err));
    EXPECT_NE(err.find("compacted"), std::string::npos);
}

TEST(Informer, RelistsOnItsPeriodEvenWhileTheWatchSeemsWell) {
    MemoryKv kv;
    ManualClock clock;
    Informer inf(kv, "/p/", clock, 30000);
    std::vector<EtcdEvent> ch;
    std::string err;
    ASSERT_TRUE(inf.poll(ch, 0, err));
    ASSERT_TRUE(inf.poll(ch, 0, err));
    EXPECT_EQ(inf.lists(), 1);
    clock.advance(30000);
    ASSERT_TRUE(inf.poll(ch, 0, err));
    EXPECT_EQ(inf.lists(), 2);
}

TEST(Backoff, APauseDoublesFromTheFirstUpToTheCapWhateverTheCount) {
    EXPECT_EQ(armada::common::backoff_ms(100, 0, 5000), 100);
    EXPECT_EQ(armada::common::backoff_ms(100, 3, 5000), 800);
    EXPECT_EQ(armada::common::backoff_ms(100, 6, 5000), 5000);
    EXPECT_EQ(armada::common::backoff_ms(100, 1000, 5000), 5000);  // no overflow past the cap
    EXPECT_EQ(armada::common::backoff_ms(250, -3, 4000), 250);
    for (int i = 0; i < 200; ++i) {
        const int ms = armada::common::jittered_ms(1000);
        EXPECT_GE(ms, 500);
        EXPECT_LE(ms, 1500);
    }
}

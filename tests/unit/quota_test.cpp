// The gateways' per-gateway quota window (their fallback when Redis is down), and the Quotas
// front without Redis: each gateway then admits the quota divided by the live gateways.
#include "cluster/quota.h"

#include <gtest/gtest.h>

using armada::cluster::LocalWindow;
using armada::cluster::Quotas;

TEST(LocalWindow, AdmitsUpToTheLimitInAnyMinuteAndSaysWhenTheOldestLeaves) {
    LocalWindow w;
    for (int i = 0; i < 10; ++i)
        EXPECT_TRUE(w.admit("k", 10, 1, 1000 + i).ok) << i;
    auto d = w.admit("k", 10, 1, 1010);
    EXPECT_FALSE(d.ok);
    EXPECT_EQ(d.used, 10);
    EXPECT_EQ(d.retry_after_s, 50);  // second 1000 leaves the window at 1060
    EXPECT_FALSE(w.admit("k", 10, 1, 1059).ok);
    EXPECT_TRUE(w.admit("k", 10, 1, 1060).ok);  // one second's worth left
    EXPECT_FALSE(w.admit("k", 10, 1, 1060).ok);
    EXPECT_TRUE(w.admit("other", 10, 1, 1060).ok);  // keys are apart
}

TEST(LocalWindow, ACostThatDoesNotFitIsRefusedUnlessTheWindowIsEmpty) {
    LocalWindow w;
    EXPECT_TRUE(w.admit("t", 100, 60, 0).ok);
    EXPECT_FALSE(w.admit("t", 100, 60, 1).ok);  // 60 + 60 > 100
    EXPECT_TRUE(w.admit("t", 100, 40, 1).ok);
    LocalWindow big;
    EXPECT_TRUE(big.admit("t", 100, 500, 0).ok);  // larger than the quota: alone, once
    EXPECT_FALSE(big.admit("t", 100, 1, 1).ok);
}

TEST(LocalWindow, SettlingGivesBackWhatAReservationDidNotUse) {
    LocalWindow w;
    EXPECT_TRUE(w.admit("t", 100, 90, 5).ok);
    EXPECT_FALSE(w.admit("t", 100, 20, 6).ok);
    w.settle("t", 5, -80, 6);  // it used 10
    EXPECT_TRUE(w.admit("t", 100, 20, 6).ok);
    w.settle("t", 5, 1000, 70);  // second 5 has left the window: nothing to settle
    EXPECT_TRUE(w.admit("t", 100, 20, 70).ok);
}

TEST(Quotas, WithoutRedisEachGatewayAdmitsItsShare) {
    int gateways = 2;
    Quotas q(nullptr, [&] { return gateways; });
    int admitted = 0;
    for (int i = 0; i < 100; ++i)
        admitted += q.request("t:acme", 60) ? 0 : 1;
    EXPECT_EQ(admitted, 30);
    EXPECT_TRUE(q.local());
    EXPECT_EQ(q.local_decisions(), 100u);
    auto r = q.request("t:acme", 60);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->quota, "requests_per_minute");
    EXPECT_EQ(r->limit, 60);
    EXPECT_TRUE(r->local);
    EXPECT_GE(r->retry_after_s, 1);
    // Another tenant, and no quota at all, are not touched.
    EXPECT_FALSE(q.request("t:other", 60));
    EXPECT_FALSE(q.request("t:acme", 0));
}

TEST(Quotas, TokensReservedByThisGatewayAloneAreSettledHere) {
    Quotas q(nullptr, [] { return 1; });
    Quotas::TokenHold hold, other;
    EXPECT_FALSE(q.reserve_tokens("t:a", 1000, 900, hold));
    EXPECT_TRUE(hold.local);
    EXPECT_TRUE(q.reserve_tokens("t:a", 1000, 200, other));
    q.settle_tokens("t:a", hold, 100);
    EXPECT_FALSE(q.reserve_tokens("t:a", 1000, 200, other));
}

TEST(Quotas, ATinyQuotaOverManyGatewaysStillAdmitsOneEach) {
    Quotas q(nullptr, [] { return 8; });
    EXPECT_FALSE(q.request("t:a", 3));  // 3 / 8 rounds to 0: never refuse everything
    EXPECT_TRUE(q.request("t:a", 3));
}

TEST(Quotas, LiveSessionsWithoutRedisCountTheStoresOpenSessions) {
    Quotas q(nullptr, [] { return 2; });
    std::vector<std::string> open = {"s1", "s2"};
    auto ids = [&] { return std::optional<std::vector<std::string>>(open); };
    EXPECT_FALSE(q.live_session("t:a", "s3", 3, ids));
    open.push_back("s3");
    auto r = q.live_session("t:a", "s4", 3, ids);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->quota, "live_sessions");
    // The store cannot be read: admitted rather than refusing everything.
    EXPECT_FALSE(q.live_session("t:a", "s4", 3, [] { return std::optional<std::vector<std::string>>(); }));
}

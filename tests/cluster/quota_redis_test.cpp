// Tenant quotas shared by gateways through a real redis-server (the Debian binary): two Quotas
// fronts stand for two gateways.
#include "cluster/quota.h"
#include "servers.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

using namespace armada::cluster;

namespace {

std::unique_ptr<RedisPool> pool() {
    std::string err;
    auto p = RedisPool::open(servers().redis.url(), 2, 300, err, servers().redis.credentials());
    EXPECT_TRUE(p) << err;
    return p;
}

}  // namespace

TEST(QuotasOnRedis, TwoGatewaysTogetherAdmitTheQuotaOnce) {
    auto ra = pool(), rb = pool();
    Quotas a(ra.get(), [] { return 2; }), b(rb.get(), [] { return 2; });
    int admitted = 0;
    for (int i = 0; i < 50; ++i) {
        admitted += a.request("t:shared", 60) ? 0 : 1;
        admitted += b.request("t:shared", 60) ? 0 : 1;
    }
    EXPECT_EQ(admitted, 60);
    EXPECT_FALSE(a.local());
    EXPECT_EQ(a.local_decisions() + b.local_decisions(), 0u);
    auto r = b.request("t:shared", 60);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->quota, "requests_per_minute");
    EXPECT_FALSE(r->local);
    EXPECT_GE(r->retry_after_s, 1);
    EXPECT_LE(r->retry_after_s, 60);
}

TEST(QuotasOnRedis, ReservedTokensAreSettledWithWhatWasUsed) {
    auto ra = pool(), rb = pool();
    Quotas a(ra.get(), [] { return 2; }), b(rb.get(), [] { return 2; });
    Quotas::TokenHold at, at2;
    EXPECT_FALSE(a.reserve_tokens("t:tok", 1000, 900, at));
    EXPECT_FALSE(at.local);
    EXPECT_TRUE(b.reserve_tokens("t:tok", 1000, 200, at2));  // 900 + 200 > 1000
    a.settle_tokens("t:tok", at, 100);                       // it used 100
    EXPECT_FALSE(b.reserve_tokens("t:tok", 1000, 200, at2));
}

TEST(QuotasOnRedis, LiveSessionsAreSharedAndEndedOnesLeaveWhenTheSetIsFull) {
    auto ra = pool(), rb = pool();
    Quotas a(ra.get(), [] { return 2; }), b(rb.get(), [] { return 2; });
    a.set_repair_grace_ms(0);  // b keeps the default: a session admitted 10 s ago may still be being stored
    std::vector<std::string> open;
    int reads = 0;
    auto ids = [&] {
        ++reads;
        return std::optional<std::vector<std::string>>(open);
    };
    EXPECT_FALSE(a.live_session("t:live", "s1", 2, ids));
    EXPECT_FALSE(b.live_session("t:live", "s2", 2, ids));
    EXPECT_FALSE(a.live_session("t:live", "s2", 2, ids));  // the same session again: no new place
    EXPECT_EQ(reads, 0);
    open = {"s1", "s2"};
    auto r = a.live_session("t:live", "s3", 2, ids);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->quota, "live_sessions");
    EXPECT_FALSE(r->local);
    EXPECT_EQ(reads, 1);
    open = {"s2"};                                        // s1 ended
    EXPECT_TRUE(a.live_session("t:live", "s3", 2, ids));  // the store is read at most once a second
    EXPECT_EQ(reads, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    EXPECT_FALSE(a.live_session("t:live", "s3", 2, ids));  // s1 left the set
    EXPECT_EQ(reads, 2);
    open = {"s2", "s3"};
    EXPECT_TRUE(b.live_session("t:live", "s4", 2, ids));
    // A session that was admitted but never stored leaves at once.
    a.forget_session("t:live", "s3");
    EXPECT_FALSE(b.live_session("t:live", "s4", 2, ids));
}

TEST(QuotasOnRedis, WithRedisHungEachGatewayAdmitsItsShareAndSharesAgainAfter) {
    auto ra = pool(), rb = pool();
    Quotas a(ra.get(), [] { return 2; }), b(rb.get(), [] { return 2; });
    const pid_t pid = servers().redis.pid();
    ASSERT_GT(pid, 0);
    ASSERT_EQ(kill(pid, SIGSTOP), 0);  // it accepts connections and answers nothing
    int from_a = 0, from_b = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 40; ++i) {
        from_a += a.request("t:hung", 20) ? 0 : 1;
        from_b += b.request("t:hung", 20) ? 0 : 1;
    }
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(kill(pid, SIGCONT), 0);
    EXPECT_EQ(from_a, 10);
    EXPECT_EQ(from_b, 10);
    EXPECT_TRUE(a.local());
    EXPECT_GT(a.local_decisions(), 0u);
    // Requests do not each wait out the timeout: after one, Redis is skipped for a second.
    EXPECT_LT(took, 4000);
    // Redis is tried again after a jittered pause (about a second).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (a.local() && std::chrono::steady_clock::now() < deadline) {
        a.request("t:back", 20);  // refused while its local share is used up
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_FALSE(a.local());
    EXPECT_FALSE(a.request("t:back", 20));  // the shared count has room
}

TEST(RedisPool, ACallThatFindsEveryConnectionTakenWaitsAndTheMetricsSaySo) {
    std::string err;
    auto p = RedisPool::open(servers().redis.url(), 1, 2000, err, servers().redis.credentials());
    ASSERT_TRUE(p) << err;
    // One call holds the only connection for about 300 ms (a script that spins on the clock).
    std::thread busy([&] {
        p->eval(R"lua(
local t = redis.call('TIME'); local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > 300000
return {1})lua",
                {"armada:t:test:busy"}, {});
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(p->set("armada:t:test:k", "v", 10000));  // waits for the connection, then goes on
    busy.join();
    const auto s = p->stats();
    EXPECT_EQ(s.size, 1u);
    EXPECT_EQ(s.acquired, 2u);
    EXPECT_EQ(s.waited, 1u);
    EXPECT_GT(s.wait_us, 100000u);
    EXPECT_EQ(s.timeouts, 0u);
}

TEST(QuotasOnRedis, WithRedisStoppedEachGatewayAdmitsItsShareAndSharesAgainWhenItIsBack) {
    auto ra = pool(), rb = pool();
    Quotas a(ra.get(), [] { return 2; }), b(rb.get(), [] { return 2; });
    ASSERT_EQ(servers().redis.stop(), "");  // connections are refused
    int from_a = 0, from_b = 0;
    for (int i = 0; i < 40; ++i) {
        from_a += a.request("t:stopped", 30) ? 0 : 1;
        from_b += b.request("t:stopped", 30) ? 0 : 1;
    }
    ASSERT_EQ(servers().redis.restart(), "");
    EXPECT_EQ(from_a, 15);
    EXPECT_EQ(from_b, 15);
    EXPECT_TRUE(a.local() && b.local());
    // Redis is tried again after a jittered pause (about a second): requests go on meanwhile, and
    // the first one after the pause finds it back.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (a.local() && std::chrono::steady_clock::now() < deadline) {
        a.request("t:stopped-back", 30);  // refused while its local share is used up
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_FALSE(a.local());
    EXPECT_FALSE(a.request("t:stopped-back", 30));  // the shared count has room
}

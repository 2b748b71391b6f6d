#include "api/rate_limit.h"
#include "api/auth.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

using armada::api::ApiKeys;
using armada::api::RateLimiter;
using armada::api::RateLimits;

namespace {
struct FakeTime {
    int64_t ms = 1000;
    RateLimiter::Now fn() {
        return [this] { return ms; };
    }
};
}  // namespace

TEST(RateLimiter, OffByDefaultAdmitsEverything) {
    RateLimiter r;
    EXPECT_FALSE(r.enabled());
    for (int i = 0; i < 1000; ++i)
        ASSERT_TRUE(r.admit("k").ok);
}

TEST(RateLimiter, RequestsPerMinuteRefillContinuously) {
    FakeTime t;
    RateLimiter r({60, 0}, t.fn());
    for (int i = 0; i < 60; ++i)
        ASSERT_TRUE(r.admit("k").ok) << i;
    auto d = r.admit("k");
    EXPECT_FALSE(d.ok);
    EXPECT_STREQ(d.which, "requests");
    EXPECT_EQ(d.limit, 60);
    EXPECT_EQ(d.retry_after_s, 1);  // one request per second comes back
    t.ms += 1000;
    EXPECT_TRUE(r.admit("k").ok);
    EXPECT_FALSE(r.admit("k").ok);
    // Another key has its own bucket.
    EXPECT_TRUE(r.admit("other").ok);
    // The bucket never holds more than one minute's worth.
    t.ms += 3600 * 1000;
    for (int i = 0; i < 60; ++i)
        ASSERT_TRUE(r.admit("k").ok) << i;
    EXPECT_FALSE(r.admit("k").ok);
}

TEST(RateLimiter, TokensAreChargedAfterwardsAndDebtBlocks) {
    FakeTime t;
    RateLimiter r({0, 600}, t.fn());
    ASSERT_TRUE(r.admit("k").ok);
    r.charge("k", 500);
    EXPECT_NEAR(r.tokens_left("k"), 100, 1e-9);
    ASSERT_TRUE(r.admit("k").ok);  // still above zero
    r.charge("k", 700);            // one long answer takes it into debt
    EXPECT_NEAR(r.tokens_left("k"), -600, 1e-9);
    auto d = r.admit("k");
    EXPECT_FALSE(d.ok);
    EXPECT_STREQ(d.which, "tokens");
    // 601 tokens at 10 per second: 60.1 s, rounded up.
    EXPECT_EQ(d.retry_after_s, 61);
    t.ms += 60 * 1000;
    EXPECT_FALSE(r.admit("k").ok);
    t.ms += 1000;
    EXPECT_TRUE(r.admit("k").ok);
}

TEST(RateLimiter, PerKeyOverridesWinOverDefaults) {
    FakeTime t;
    RateLimiter r({2, 0}, t.fn());
    r.set_limits("vip", {100, 0});
    r.set_limits("free", {0, 0});  // unlimited
    for (int i = 0; i < 100; ++i)
        ASSERT_TRUE(r.admit("vip").ok);
    EXPECT_FALSE(r.admit("vip").ok);
    for (int i = 0; i < 500; ++i)
        ASSERT_TRUE(r.admit("free").ok);
    EXPECT_TRUE(r.admit("anyone").ok);
    EXPECT_TRUE(r.admit("anyone").ok);
    EXPECT_FALSE(r.admit("anyone").ok);
}

TEST(RateLimiter, OverridesAloneEnableIt) {
    RateLimiter r;
    r.set_limits("k", {1, 0});
    EXPECT_TRUE(r.enabled());
    EXPECT_TRUE(r.admit("k").ok);
    EXPECT_FALSE(r.admit("k").ok);
    EXPECT_TRUE(r.admit("unlisted").ok);
}

TEST(ApiKeyFile, KeysMayCarryTheirOwnLimits) {
    const std::string path = ::testing::TempDir() + "/keys.txt";
    {
        std::ofstream f(path);
        f << "# comment\n\nsk-plain\nsk-limited rpm=60 tpm=1000\r\n  sk-spaced   tpm=5  \n";
    }
    ApiKeys k;
    ASSERT_EQ(k.load_file(path), "");
    EXPECT_EQ(k.check("Bearer sk-plain", "")->key, "sk-plain");
    EXPECT_EQ(k.check("Bearer sk-limited", "")->key, "sk-limited");
    EXPECT_EQ(k.check("", "sk-spaced")->key, "sk-spaced");
    ASSERT_EQ(k.keys().size(), 3u);
    EXPECT_FALSE(k.keys()[0].limits.has_value());
    EXPECT_EQ(k.keys()[1].key, "sk-limited");
    EXPECT_EQ(k.keys()[1].limits->requests_per_min, 60);
    EXPECT_EQ(k.keys()[1].limits->tokens_per_min, 1000);
    EXPECT_EQ(k.keys()[2].limits->requests_per_min, 0);
    EXPECT_EQ(k.keys()[2].limits->tokens_per_min, 5);
    std::remove(path.c_str());
}

TEST(ApiKeyFile, BadLimitSyntaxNamesTheLine) {
    const std::string path = ::testing::TempDir() + "/badkeys.txt";
    for (const char * bad : {"sk-a rpm", "sk-a rpm=x", "sk-a rpm=-1", "sk-a burst=3", "sk-a tpm=5z"}) {
        {
            std::ofstream f(path);
            f << "sk-ok\n" << bad << "\n";
        }
        ApiKeys k;
        const std::string err = k.load_file(path);
        EXPECT_NE(err.find(":2:"), std::string::npos) << bad << " -> " << err;
    }
    std::remove(path.c_str());
}

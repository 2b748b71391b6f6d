// The prompt cache's index and its entries in the KV pool, without a model.
#include "engine/prefix_cache.h"
#include "engine/kv_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <random>

using namespace armada::engine;
namespace fs = std::filesystem;

namespace {

Tokens seq(int from, int n) {
    Tokens t;
    for (int i = 0; i < n; ++i)
        t.push_back(llama_token(from + i));
    return t;
}

Tokens cat(Tokens a, const Tokens & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

constexpr size_t B = PrefixCache::kBlock;

//! A saved state of `n` bytes for ten tokens.
KvBlob blob(size_t n) {
    KvBlob b;
    b.tokens = seq(0, 10);
    b.data.assign(n, 7);
    return b;
}

}  // namespace

TEST(PrefixCache, BlockHashesAreChainedAndScoped) {
    PrefixCache c("fp");
    const Tokens a = seq(0, 3 * B + 5);
    Tokens b = a;
    b[B + 1] = 99999;  // differs in block 1
    const auto ha = c.block_hashes("t", a), hb = c.block_hashes("t", b);
    ASSERT_EQ(ha.size(), 3u);  // whole blocks only
    EXPECT_EQ(ha[0], hb[0]);
    EXPECT_NE(ha[1], hb[1]);
    EXPECT_NE(ha[2], hb[2]);  // a block's hash covers everything before it
    EXPECT_NE(c.block_hashes("u", a)[0], ha[0]);
    EXPECT_NE(PrefixCache("other-fp").block_hashes("t", a)[0], ha[0]);
    EXPECT_NE(c.key_for("t", a), c.key_for("u", a));
    EXPECT_EQ(PrefixCache::scope_of(c.key_for("t:acme/x", a)), "t:acme/x");
    EXPECT_EQ(PrefixCache::scope_of("sess_123"), std::nullopt);
}

TEST(PrefixCache, FindsTheLongestSharedPrefixWithinTheScopeOnly) {
    PrefixCache c("fp");
    const Tokens sys = seq(1000, 2 * B + 10);
    const Tokens conv1 = cat(sys, seq(5000, 3 * B));
    const Tokens conv2 = cat(sys, seq(7000, B));
    EXPECT_FALSE(c.insert("short", "t", seq(0, B - 1)));  // shorter than a block: not worth it
    ASSERT_TRUE(c.insert(c.key_for("t", conv1), "t", conv1));
    ASSERT_TRUE(c.insert(c.key_for("t", conv2), "t", conv2));
    // The next turn of conversation 1 finds conversation 1, with every token it shares.
    const auto m = c.longest("t", cat(conv1, seq(9000, 20)));
    ASSERT_TRUE(m);
    EXPECT_EQ(m->key, c.key_for("t", conv1));
    EXPECT_EQ(m->common, conv1.size());
    // A new conversation with the same system prompt finds one of them, sharing the system prompt.
    const auto n = c.longest("t", cat(sys, seq(11000, B)));
    ASSERT_TRUE(n);
    EXPECT_EQ(n->common, sys.size());
    // Another tenant finds nothing, nor a prompt sharing less than a block.
    EXPECT_FALSE(c.longest("u", cat(conv1, seq(9000, 20))));
    EXPECT_FALSE(c.longest("t", cat(seq(1000, B - 1), seq(1, 3 * B))));
    // An entry under another scope's key but the same tokens is not returned for this scope.
    PrefixCache d("fp");
    ASSERT_TRUE(d.insert("c/u/forged", "u", conv1));
    EXPECT_FALSE(d.longest("t", conv1));
}

TEST(PrefixCache, AnExtendedConversationMakesItsEarlierEntryRedundant) {
    PrefixCache c("fp");
    const Tokens turn1 = seq(0, 2 * B + 3);
    const Tokens turn2 = cat(turn1, seq(500, B));
    const Tokens other = cat(seq(0, B), seq(900, B));
    ASSERT_TRUE(c.insert(c.key_for("t", turn1), "t", turn1));
    ASSERT_TRUE(c.insert(c.key_for("t", other), "t", other));
    ASSERT_TRUE(c.insert(c.key_for("u", turn1), "u", turn1));
    const auto covered = c.covered_by("t", turn2);
    ASSERT_EQ(covered.size(), 1u);
    EXPECT_EQ(covered[0], c.key_for("t", turn1));
    c.erase(covered[0]);
    EXPECT_EQ(c.entries(), 2u);
    EXPECT_FALSE(c.contains(c.key_for("t", turn1)));
    EXPECT_TRUE(c.contains(c.key_for("u", turn1)));
}

TEST(PrefixCache, PoolEvictsCacheEntriesFirstAndWithoutPressure) {
    KvPoolConfig pc;
    pc.ram_limit = 3000;
    pc.ram_low = 2900;  // one entry's room (940 bytes each with its tokens)
    pc.fingerprint = "fp";
    std::vector<std::string> dropped;
    pc.dropped = [&](const std::string & k) { dropped.push_back(k); };
    KvPool pool(pc);
    ASSERT_EQ(pool.open(), "");
    pool.put("sess_a", blob(900), true);  // cold: a session waiting for its user
    pool.put("c/t/1", blob(900), false, true);
    pool.put("sess_b", blob(900), false);
    EXPECT_EQ(pool.stats().cache_ram_entries, 1u);
    // Over the limit with no disk tier: the cache entry goes, although sess_a is older and cold.
    pool.put("sess_c", blob(900), false);
    EXPECT_EQ(dropped, std::vector<std::string>{"c/t/1"});
    EXPECT_TRUE(pool.contains("sess_a"));
    const auto st = pool.stats();
    EXPECT_EQ(st.cache_evicted, 1u);
    EXPECT_EQ(st.dropped, 0u);
    EXPECT_EQ(st.cache_ram_entries, 0u);
    EXPECT_EQ(st.cache_ram_bytes, 0u);
    EXPECT_FALSE(pool.pressured());  // new sessions are not turned away for a cache entry
}

TEST(PrefixCache, AmongCacheEntriesTheLeastRecentlyUsedGoesFirst) {
    KvPoolConfig pc;
    pc.ram_limit = 3000;
    pc.ram_low = 2900;
    pc.fingerprint = "fp";
    std::vector<std::string> dropped;
    pc.dropped = [&](const std::string & k) { dropped.push_back(k); };
    KvPool pool(pc);
    ASSERT_EQ(pool.open(), "");
    pool.put("c/t/1", blob(900), false, true);
    pool.put("c/t/2", blob(900), false, true);
    pool.put("c/t/3", blob(900), false, true);
    // The oldest entry is read (restored into a sequence) and kept: it is now the newest.
    KvTier from{};
    std::string why;
    ASSERT_TRUE(pool.get("c/t/1", true, from, why)) << why;
    pool.put("c/t/4", blob(900), false, true);
    EXPECT_EQ(dropped, std::vector<std::string>{"c/t/2"});
    pool.put("c/t/5", blob(900), false, true);
    EXPECT_EQ(dropped, (std::vector<std::string>{"c/t/2", "c/t/3"}));
    EXPECT_TRUE(pool.contains("c/t/1"));
    EXPECT_EQ(pool.stats().cache_evicted, 2u);
}

TEST(PrefixCache, CacheEntriesInRamDoNotHoldPressureOn) {
    KvPoolConfig pc;
    pc.ram_limit = 3000;
    pc.ram_low = 1000;
    pc.fingerprint = "fp";
    auto now = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
    pc.now = [now] { return *now; };
    KvPool pool(pc);
    ASSERT_EQ(pool.open(), "");
    for (const char * k : {"s1", "s2", "s3", "s4"})
        pool.put(k, blob(900), false);
    ASSERT_TRUE(pool.pressured());  // sessions' KV was dropped for room
    pool.erase("s4");
    pool.put("c/t/1", blob(900), false, true);
    pool.put("c/t/2", blob(900), false, true);
    EXPECT_GT(pool.stats().ram_bytes, pc.ram_low);
    // After the hold, only cache entries hold RAM above the low watermark: new sessions are
    // welcome again.
    *now += std::chrono::milliseconds(pc.pressure_hold_ms + 1);
    EXPECT_FALSE(pool.pressured());
}

TEST(PrefixCache, PoolReportsFilesFoundAtOpenAndDeletesRefusedOnes) {
    const fs::path dir = fs::temp_directory_path() / ("armada-pcache-unit-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    KvPoolConfig pc;
    pc.dir = dir.string();
    pc.ram_limit = 0;  // everything spills
    pc.ram_low = 0;
    pc.fingerprint = "fp";
    {
        KvPool pool(pc);
        ASSERT_EQ(pool.open(), "");
        KvBlob b;
        b.tokens = seq(0, 3 * B);
        b.data.assign(1000, 1);
        pool.put("c/t/keep", b, false, true);
        pool.put("c/t/drop", b, false, true);
        pool.put("sess_x", b, false);
        EXPECT_EQ(pool.stats().cache_disk_entries, 2u);
    }
    std::vector<std::string> seen;
    pc.found = [&](const std::string & key, const std::string & fp, const Tokens & tokens) {
        seen.push_back(key);
        EXPECT_EQ(fp, "fp");
        EXPECT_EQ(tokens, seq(0, 3 * B));
        if (key == "c/t/drop") return KvPoolConfig::Found::Remove;
        return key == "c/t/keep" ? KvPoolConfig::Found::Cache : KvPoolConfig::Found::Keep;
    };
    KvPool pool(pc);
    ASSERT_EQ(pool.open(), "");
    EXPECT_EQ(seen.size(), 3u);
    EXPECT_TRUE(pool.contains("c/t/keep"));
    EXPECT_FALSE(pool.contains("c/t/drop"));
    EXPECT_TRUE(pool.contains("sess_x"));
    const auto st = pool.stats();
    EXPECT_EQ(st.cache_disk_entries, 1u);
    EXPECT_EQ(st.disk_entries, 2u);
    size_t files = 0;
    for (const auto & e : fs::directory_iterator(dir))
        files += e.path().extension() == ".kv";
    EXPECT_EQ(files, 2u);
    fs::remove_all(dir);
}

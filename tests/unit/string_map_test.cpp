#include "cluster/string_map.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

using armada::cluster::StringMap;

TEST(StringMap, FindsWhatWasPutAndForgetsWhatWasErased) {
    StringMap<int> m;
    EXPECT_EQ(m.find("a"), nullptr);
    EXPECT_FALSE(m.erase("a"));
    auto [a, made] = m.try_emplace("a");
    ASSERT_TRUE(made);
    *a = 7;
    auto [again, made_again] = m.try_emplace("a");
    EXPECT_FALSE(made_again);
    EXPECT_EQ(*again, 7);
    EXPECT_EQ(m.size(), 1u);
    EXPECT_TRUE(m.erase("a"));
    EXPECT_EQ(m.find("a"), nullptr);
    EXPECT_TRUE(m.empty());
}

// Random inserts, erases (by key and by position) and lookups against std::map, through many
// rounds of growth and with keys that share long prefixes: every key is found exactly while it
// is in the reference, with its value, and iteration visits each entry once.
TEST(StringMap, AgreesWithStdMapThroughGrowthAndErasure) {
    std::mt19937_64 rng(42);
    StringMap<uint64_t> m;
    std::map<std::string, uint64_t> ref;
    auto key = [&](uint64_t k) { return "sess_" + std::to_string(k % 5000); };
    for (int step = 0; step < 200000; ++step) {
        const uint64_t r = rng();
        const std::string k = key(r >> 8);
        switch (r % 5) {
            case 0:
            case 1: {
                auto [v, made] = m.try_emplace(k);
                EXPECT_EQ(made, ref.count(k) == 0) << k;
                *v = r;
                ref[k] = r;
                break;
            }
            case 2:
                EXPECT_EQ(m.erase(k), ref.erase(k) == 1) << k;
                break;
            case 3:
                if (!m.empty()) {
                    const size_t i = size_t(r >> 16) % m.size();
                    ref.erase(m.at(i).first);
                    m.erase_at(i);
                }
                break;
            default: {
                const uint64_t * v = m.find(k);
                auto it = ref.find(k);
                ASSERT_EQ(v != nullptr, it != ref.end()) << k;
                if (v) EXPECT_EQ(*v, it->second);
            }
        }
        ASSERT_EQ(m.size(), ref.size());
    }
    std::map<std::string, uint64_t> seen;
    for (const auto & [k, v] : m)
        EXPECT_TRUE(seen.emplace(k, v).second) << k;
    EXPECT_EQ(seen, ref);
    for (const auto & [k, v] : ref) {
        const uint64_t * got = m.find(k);
        ASSERT_NE(got, nullptr) << k;
        EXPECT_EQ(*got, v);
    }
}

#include "engine/fast_sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

using namespace armada::engine;

namespace {
std::vector<float> random_logits(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0, 3);
    std::vector<float> v(static_cast<size_t>(n), 0.0f);
    for (auto & x : v)
        x = d(rng);
    return v;
}

llama_token slow_argmax(const std::vector<float> & l, const std::vector<llama_logit_bias> & bias) {
    std::vector<float> v = l;
    for (const auto & b : bias)
        v[size_t(b.token)] += b.bias;
    return llama_token(std::max_element(v.begin(), v.end()) - v.begin());
}
}  // namespace

TEST(FastSampler, GreedyMatchesPlainArgmax) {
    for (uint32_t seed = 0; seed < 50; ++seed) {
        auto l = random_logits(1001, seed);
        FastSamplerParams p;
        p.temperature = 0;
        FastSampler s(p);
        EXPECT_EQ(s.sample(l.data(), 1001), slow_argmax(l, {}));
    }
}

TEST(FastSampler, GreedyHonoursBiasOnTheWinner) {
    auto l = random_logits(500, 3);
    const llama_token top = slow_argmax(l, {});
    FastSamplerParams p;
    p.temperature = 0;
    p.logit_bias = {{top, -INFINITY}};
    FastSampler s(p);
    const llama_token got = s.sample(l.data(), 500);
    EXPECT_NE(got, top);
    EXPECT_EQ(got, slow_argmax(l, p.logit_bias));
}

TEST(FastSampler, GreedyPositiveBiasWins) {
    auto l = random_logits(500, 4);
    FastSamplerParams p;
    p.temperature = 0;
    p.logit_bias = {{7, 100.0f}};
    FastSampler s(p);
    EXPECT_EQ(s.sample(l.data(), 500), 7);
}

TEST(FastSampler, TopKOne) {
    auto l = random_logits(300, 9);
    FastSamplerParams p;
    p.temperature = 1.0f;
    p.top_k = 1;
    FastSampler s(p);
    for (int i = 0; i < 20; ++i)
        EXPECT_EQ(s.sample(l.data(), 300), slow_argmax(l, {}));
}

TEST(FastSampler, SameSeedSameSequence) {
    auto l = random_logits(300, 10);
    FastSamplerParams p;
    p.temperature = 1.0f;
    p.seed = 42;
    FastSampler a(p), b(p);
    for (int i = 0; i < 50; ++i)
        EXPECT_EQ(a.sample(l.data(), 300), b.sample(l.data(), 300));
}

TEST(FastSampler, SamplesFollowTheDistribution) {
    // Two tokens with logits 0 and log(3): expect about 1:3.
    std::vector<float> l = {0.0f, std::log(3.0f), -50.0f};
    FastSamplerParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1;
    FastSampler s(p);
    std::map<llama_token, int> n;
    for (int i = 0; i < 20000; ++i)
        n[s.sample(l.data(), 3)]++;
    EXPECT_NEAR(double(n[1]) / 20000, 0.75, 0.02);
    EXPECT_EQ(n[2], 0);
}

TEST(FastSampler, TopKOfOrdersDescending) {
    std::vector<float> l = {1, 5, 3, 5, 0};
    std::vector<std::pair<float, llama_token>> out;
    top_k_of(l.data(), nullptr, 5, 3, out);
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[0].second, 1);
    EXPECT_EQ(out[1].second, 3);
    EXPECT_EQ(out[2].second, 2);
}

#include "engine/fast_sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace armada::engine {

void top_k_of(const float * logits, const float * bias, int32_t n_vocab, int32_t k,
              std::vector<std::pair<float, llama_token>> & out) {
    k = std::clamp(k, 1, n_vocab);
    out.clear();
    out.reserve(size_t(k) + 1);
    // A min-heap of the best k seen so far; most logits fail the first comparison.
    auto cmp = std::greater<std::pair<float, llama_token>>();
    for (int32_t i = 0; i < n_vocab; ++i) {
        const float v = bias ? logits[i] + bias[i] : logits[i];
        if (int32_t(out.size()) < k) {
            out.emplace_back(v, i);
            std::push_heap(out.begin(), out.end(), cmp);
        } else if (v > out.front().first) {
            std::pop_heap(out.begin(), out.end(), cmp);
            out.back() = {v, i};
            std::push_heap(out.begin(), out.end(), cmp);
        }
    }
    // Largest first; ties keep the lower token id first, as llama.cpp's sort does.
    std::sort(out.begin(), out.end(), [](const auto & a, const auto & b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
}

namespace {
// Largest value of a row; 16 independent lanes let the compiler vectorise the reduction.
float row_max(const float * x, int32_t n) {
    constexpr int L = 16;
    float m[L];
    for (int l = 0; l < L; ++l)
        m[l] = -INFINITY;
    int32_t i = 0;
    for (; i + L <= n; i += L) {
        for (int l = 0; l < L; ++l)
            m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    }
    float best = -INFINITY;
    for (int l = 0; l < L; ++l)
        best = m[l] > best ? m[l] : best;
    for (; i < n; ++i)
        best = x[i] > best ? x[i] : best;
    return best;
}

// Greedy choice over logits + a sparse bias. The winner is either a biased token, checked one by
// one, or the raw argmax when that token carries no bias; only when the raw winner is itself
// biased does it take the slow full scan.
llama_token greedy(const float * logits, int32_t n, const std::vector<llama_logit_bias> & sparse, const float * dense) {
    const float m = row_max(logits, n);
    llama_token raw = 0;
    while (raw < n && !(logits[raw] == m))
        ++raw;
    if (raw == n) raw = 0;  // all NaN: nothing better to do
    if (!dense || dense[raw] == 0.0f) {
        llama_token best = raw;
        float best_v = m;
        for (const auto & b : sparse) {
            if (b.token < 0 || b.token >= n) continue;
            const float v = logits[b.token] + dense[b.token];
            if (v > best_v || (v == best_v && b.token < best)) {
                best_v = v;
                best = b.token;
            }
        }
        return best;
    }
    llama_token best = 0;
    float best_v = -INFINITY;
    for (int32_t i = 0; i < n; ++i) {
        const float v = logits[i] + dense[i];
        if (v > best_v) {
            best_v = v;
            best = i;
        }
    }
    return best;
}
}  // namespace

FastSampler::FastSampler(FastSamplerParams p) : p_(std::move(p)), rng_(p_.seed) {}

llama_token FastSampler::sample(const float * logits, int32_t n_vocab) {
    if (!p_.logit_bias.empty() && bias_.empty()) {
        bias_.assign(size_t(n_vocab), 0.0f);
        for (const auto & b : p_.logit_bias) {
            if (b.token >= 0 && b.token < n_vocab) bias_[size_t(b.token)] += b.bias;
        }
    }
    const float * bias = bias_.empty() ? nullptr : bias_.data();
    if (p_.temperature <= 0.0f) return greedy(logits, n_vocab, p_.logit_bias, bias);
    top_k_of(logits, bias, n_vocab, p_.top_k > 0 ? p_.top_k : n_vocab, cand_);
    // As in llama.cpp's default chain, top_p and min_p cut on the untempered distribution and
    // the temperature then shapes what is left.
    const float max_l = cand_.front().first;
    std::vector<float> prob(cand_.size());
    float sum = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
        prob[i] = std::exp(cand_[i].first - max_l);
        sum += prob[i];
    }
    size_t keep = cand_.size();
    if (p_.top_p < 1.0f) {
        float cum = 0;
        size_t n = 0;
        while (n < keep) {
            cum += prob[n++] / sum;
            if (cum >= p_.top_p) break;
        }
        keep = std::max<size_t>(n, 1);
    }
    if (p_.min_p > 0) {
        const float floor = prob[0] * p_.min_p;
        size_t n = 1;
        while (n < keep && prob[n] >= floor)
            ++n;
        keep = n;
    }
    for (size_t i = 0; i < keep; ++i)
        prob[i] = std::exp((cand_[i].first - max_l) / p_.temperature);
    float total = 0;
    for (size_t i = 0; i < keep; ++i)
        total += prob[i];
    std::uniform_real_distribution<float> u(0.0f, total);
    float r = u(rng_);
    for (size_t i = 0; i < keep; ++i) {
        r -= prob[i];
        if (r <= 0) return cand_[i].second;
    }
    return cand_[keep - 1].second;
}

}  // namespace armada::engine

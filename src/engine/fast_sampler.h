#pragma once

#include <llama.h>

#include <cstdint>
#include <random>
#include <vector>

namespace armada::engine {

//! Sampling without grammar and without repetition penalties, fused into one pass over the
//! logits. llama.cpp's general chain first copies the whole vocabulary into a candidate array
//! (151k entries for Qwen) for every token of every sequence; on a busy engine thread that
//! cost rivals the decode itself. Requests that need a grammar or penalties use the chain.
struct FastSamplerParams {
    float temperature = 0.8f;  // <= 0: greedy
    int32_t top_k = 40;        // 0: whole vocabulary
    float top_p = 0.95f;
    float min_p = 0.05f;
    uint32_t seed = 0;
    std::vector<llama_logit_bias> logit_bias;
};

//! Per-sequence state of the fused sampler. Used by the engine thread only.
class FastSampler {
  public:
    explicit FastSampler(FastSamplerParams p);
    //! Picks the next token from one row of logits.
    llama_token sample(const float * logits, int32_t n_vocab);

  private:
    FastSamplerParams p_;
    std::mt19937 rng_;
    std::vector<float> bias_;  // dense bias, empty when none
    std::vector<std::pair<float, llama_token>> cand_;
};

//! Top-k candidates of a row (largest first); `k` is clamped to the vocabulary.
void top_k_of(const float * logits, const float * bias, int32_t n_vocab, int32_t k,
              std::vector<std::pair<float, llama_token>> & out);

}  // namespace armada::engine

#pragma once

#include "engine/fast_sampler.h"
#include "engine/model.h"

#include <llama.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

namespace armada::engine {

//! Token ids grouped by the first byte of their text, and the token that is exactly one byte,
//! for each byte value. Built once per model.
struct VocabIndex {
    std::array<std::vector<llama_token>, 256> by_first_byte;
    std::array<llama_token, 256> byte_token;  // LLAMA_TOKEN_NULL when the vocabulary has none
    std::vector<llama_token> always;          // empty text or end-of-generation: the grammar decides
    static const VocabIndex & of(const Model & m);
};

//! Grammar-constrained sampling without a grammar pass over the whole vocabulary.
//!
//! llama.cpp's sampler draws a token, checks it against the grammar, and when it does not fit
//! (nearly always, for a model that is not trained on the format) runs the grammar over all
//! 151,936 candidates. Here the fallback first asks the grammar which *first bytes* can come
//! next, by offering it the 256 one-byte tokens, and then runs it only over tokens starting with
//! an allowed byte. That is exact: a token whose first byte the grammar refuses is refused whole.
//! Sampling (temperature, top-k, top-p, min-p, bias) is the fused FastSampler's, on the
//! grammar-allowed logits.
class GrammarFast {
  public:
    //! `grammar` is a GBNF grammar; `prefill` is text the prompt already holds that the
    //! grammar's root starts with (llama.cpp's generation prompt). Throws std::invalid_argument
    //! when llama.cpp rejects the grammar.
    GrammarFast(const Model & model, const std::string & grammar, const std::string & prefill, FastSamplerParams p);
    ~GrammarFast();
    GrammarFast(const GrammarFast &) = delete;
    GrammarFast & operator=(const GrammarFast &) = delete;

    llama_token sample(const float * logits, int32_t n_vocab);
    //! Advances the grammar; false when the token does not fit it (the caller ends the request).
    bool accept(llama_token t);
    //! The text the grammar allows exactly one way from here (at most `max_bytes` bytes of
    //! ASCII), already accepted: the caller feeds it to the model without sampling it
    //! ("jump-forward"). Empty when the next byte is a choice or the output may end here.
    std::string forced(size_t max_bytes);
    //! Tokens sampled so far whose first choice the grammar refused, so that the grammar ran over
    //! the candidates (the slow path; a model trained on the format rarely takes it).
    uint64_t fallbacks() const { return fallbacks_; }

  private:
    bool fits(llama_token t);
    //! Which first bytes the grammar allows next, found by offering it the one-byte tokens. A
    //! byte with no one-byte token counts as allowed (it cannot be asked about).
    std::array<bool, 256> allowed_first_bytes();
    //! The one byte the grammar allows next, or -1 when there is a choice (or an end).
    int only_next_byte();

    const Model & model_;
    const VocabIndex & index_;
    llama_sampler * grammar_ = nullptr;
    FastSampler fast_;
    uint64_t fallbacks_ = 0;
    std::vector<float> masked_;
    std::vector<llama_token_data> cand_;
};

}  // namespace armada::engine

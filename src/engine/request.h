#pragma once

#include "engine/fast_sampler.h"
#include "engine/grammar_fast.h"
#include "engine/model.h"

#include <sampling.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace armada::engine {

enum class FinishReason { Stop, Length, Cancelled, Error };

const char * finish_reason_name(FinishReason r);

struct SamplerDeleter {
    void operator()(common_sampler * s) const { common_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<common_sampler, SamplerDeleter>;

//! One generated token with its log-probability under the model (raw logits, temperature 1)
//! and the most likely alternatives at its position, when a request asked for them.
struct TokenLogprob {
    llama_token id = 0;
    std::string piece;  // the token's bytes (may be part of a UTF-8 character)
    float logprob = 0;
    std::vector<std::pair<std::string, float>> top;  // best first
};

//! What the engine reports about a sequence. Text is always whole UTF-8 characters.
struct GenEvent {
    enum class Kind { Text, Done } kind = Kind::Text;
    std::string text;  // Text: the new piece (after stop-string hold-back)
    //! Text, when the request asked for log-probabilities: the tokens generated since the last
    //! event (their text may still be held back; an event may carry tokens and no text).
    std::vector<TokenLogprob> logprobs;
    FinishReason finish = FinishReason::Stop;
    std::string error;  // Done with FinishReason::Error
    int32_t n_prompt = 0, n_cached = 0, n_generated = 0;
    double ttft_s = 0;      // time from submit to first generated token
    int32_t kv_tokens = 0;  // Done: tokens the sequence's KV holds now
    std::string kv_source;  // Done: where reused KV came from: slot, ram, disk, prefix, or empty
};

//! Called on the engine thread for every event of one request. It must not block: post the
//! event to the consumer's own executor and return.
using GenSink = std::function<void(GenEvent &&)>;

//! One generation request, built and validated on an API thread, then handed to the engine.
struct GenRequest {
    Tokens prompt;
    SamplerPtr sampler;                  // llama.cpp chain: grammar, penalties, logit bias, seed
    std::unique_ptr<FastSampler> fast;   // when set, used instead of `sampler` (no grammar, no penalties)
    std::unique_ptr<GrammarFast> gfast;  // when set, used instead of `sampler` (tool-call grammar, no penalties)
    int32_t max_tokens = -1;             // -1: until the sequence's context is full
    //! -1: no log-probabilities; 0..20: each token's, with that many alternatives.
    int32_t logprobs = -1;
    std::vector<std::string> stop;        // stop strings, matched on generated text
    bool render_special = false;          // include control tokens in the text (tool-call markers)
    std::vector<llama_token> special_ok;  // tokens always rendered (preserved tokens)
    GenSink sink;
    //! Session the KV belongs to: kept (and parked) between its requests. Empty: anonymous.
    std::string session;
    //! Whose KV this is: the prompt cache and prefix reuse never cross tenants (a hit would
    //! leak, by timing, that another tenant sent the same text).
    std::string tenant;
    //! A hint: the first `prefix_len` prompt tokens are shared by many requests (an agent's
    //! instructions and tools). When nobody holds them yet, they are saved to the prompt cache as
    //! soon as they are computed, so requests arriving meanwhile reuse them.
    int32_t prefix_len = 0;
    //! Who pays for the tokens (the hashed API key); reported to the usage hook when done.
    std::string account;
    //! The program the request belongs to, as its caller knows it: an agent session, a Responses
    //! chain, or a chat conversation (its prompt_cache_key, user, or X-Armada-Session). Empty:
    //! the session's, or else the engine infers it from the prompt-cache chain the prompt extends.
    std::string program;
    // Set by the engine when the request arrives: its tenant-scoped program key, its place in
    // arrival order, and the time (ms on the steady clock).
    std::string program_key;
    uint64_t seq = 0;
    int64_t arrived_ms = 0;
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now();
};

}  // namespace armada::engine

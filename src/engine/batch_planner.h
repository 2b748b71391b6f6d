#pragma once

#include <cstdint>
#include <vector>

namespace armada::engine {

//! A sequence with prompt tokens still to evaluate, in admission order.
struct PendingPrompt {
    int slot = 0;
    int32_t remaining = 0;
};

//! How many prompt tokens of one slot go into the next batch.
struct PromptChunk {
    int slot = 0;
    int32_t n_tokens = 0;
};

//! Plans one decode step. Every generating sequence always gets its one token (decode is never
//! starved); the rest of `n_batch` goes to prompts in admission order, at most `chunk` tokens
//! each, so the oldest prompt always advances and finishes. Pure function, no llama.cpp state.
std::vector<PromptChunk> plan_prompt_chunks(int32_t n_batch, int32_t chunk, int32_t n_generating,
                                            const std::vector<PendingPrompt> & prompts);

}  // namespace armada::engine

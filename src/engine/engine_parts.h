#pragma once

// Shared by the engine's own files and nothing else: engine.cpp (start-up, submit, stop),
// admission.cpp (which request gets which sequence, in the scheduling policy's order),
// kv_residency.cpp (where a session's KV lives: its sequence, the pool, the journal, the prompt
// cache) and engine_loop.cpp (the loop: a batch, one llama_decode, sampling and streaming).

#include "engine/engine.h"

#include <chrono>

namespace armada::engine::detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

inline void batch_add(llama_batch & b, llama_token t, llama_pos pos, llama_seq_id seq, bool logits) {
    const int i = b.n_tokens++;
    b.token[i] = t;
    b.pos[i] = pos;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seq;
    b.logits[i] = logits;
}

}  // namespace armada::engine::detail

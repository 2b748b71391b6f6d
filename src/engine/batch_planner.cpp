#include "engine/batch_planner.h"

#include <algorithm>

namespace armada::engine {

std::vector<PromptChunk> plan_prompt_chunks(int32_t n_batch, int32_t chunk, int32_t n_generating,
                                            const std::vector<PendingPrompt> & prompts) {
    std::vector<PromptChunk> out;
    int32_t budget = n_batch - n_generating;
    // Should the batch be full of generating sequences, the oldest prompt still moves by one chunk.
    if (budget <= 0 && !prompts.empty()) budget = std::max(chunk, 1);
    for (const auto & p : prompts) {
        if (budget <= 0) break;
        const int32_t n = std::min({p.remaining, std::max(chunk, 1), budget});
        if (n <= 0) continue;
        out.push_back({p.slot, n});
        budget -= n;
    }
    return out;
}

}  // namespace armada::engine

#include "engine/batch_planner.h"

#include <gtest/gtest.h>

using namespace armada::engine;

TEST(BatchPlanner, GeneratingSequencesKeepTheirPlace) {
    // 60 generating, batch 64: prompts share the 4 remaining tokens, oldest first.
    auto plan = plan_prompt_chunks(64, 512, 60, {{3, 1000}, {5, 10}});
    ASSERT_EQ(plan.size(), 1u);
    EXPECT_EQ(plan[0].slot, 3);
    EXPECT_EQ(plan[0].n_tokens, 4);
}

TEST(BatchPlanner, ChunkBoundsEachPrompt) {
    auto plan = plan_prompt_chunks(2048, 256, 2, {{0, 1000}, {1, 100}, {2, 5000}});
    ASSERT_EQ(plan.size(), 3u);
    EXPECT_EQ(plan[0].n_tokens, 256);
    EXPECT_EQ(plan[1].n_tokens, 100);
    EXPECT_EQ(plan[2].n_tokens, 256);
}

TEST(BatchPlanner, LongPromptFinishesEventually) {
    int32_t remaining = 10000, steps = 0;
    while (remaining > 0 && steps < 1000) {
        auto plan = plan_prompt_chunks(300, 256, 64, {{0, remaining}});
        ASSERT_FALSE(plan.empty());
        remaining -= plan[0].n_tokens;
        ++steps;
    }
    EXPECT_EQ(remaining, 0);
    EXPECT_EQ(steps, 10000 / 236 + 1);
}

TEST(BatchPlanner, FullBatchStillMovesOldestPrompt) {
    auto plan = plan_prompt_chunks(64, 32, 64, {{7, 100}});
    ASSERT_EQ(plan.size(), 1u);
    EXPECT_EQ(plan[0].n_tokens, 32);
}

TEST(BatchPlanner, NothingPending) {
    EXPECT_TRUE(plan_prompt_chunks(64, 32, 10, {}).empty());
}

// store::new_session_batch: the row and first step a gateway writes for a new session.

#include "store/new_session.h"
#include "agent/session_state.h"

#include <gtest/gtest.h>

using namespace armada;

TEST(NewSessionBatch, QueuedWithItsInputOrWaitingForInputInTheStatesTheAgentNames) {
    auto b = store::new_session_batch("sess_1", "worker", "acme", "hi \"there\"", "cell0", 42);
    ASSERT_EQ(b.sessions.size(), 1u);
    ASSERT_EQ(b.steps.size(), 1u);
    EXPECT_EQ(b.sessions[0].state, agent::state_name(agent::SessionState::Queued));
    EXPECT_EQ(b.sessions[0].owner, "acme");
    EXPECT_EQ(b.sessions[0].cell, "cell0");
    EXPECT_EQ(b.sessions[0].created_ms, 42);
    EXPECT_EQ(b.steps[0].seq, 1);
    EXPECT_EQ(b.steps[0].kind, "user_input");
    EXPECT_EQ(b.steps[0].payload, R"({"content":"hi \"there\""})");
    auto w = store::new_session_batch("sess_2", "worker", "acme", "", "cell0", 42);
    EXPECT_EQ(w.sessions[0].state, agent::state_name(agent::SessionState::WaitingInput));
    EXPECT_EQ(w.steps[0].kind, "state");
    EXPECT_EQ(w.steps[0].payload, R"({"state":"waiting_input"})");
}

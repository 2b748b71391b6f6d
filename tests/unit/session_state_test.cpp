#include "agent/session_state.h"

#include <gtest/gtest.h>

using namespace armada::agent;
using S = SessionState;
using E = SessionEvent;

namespace {
void expect(S from, E ev, std::optional<S> to) {
    EXPECT_EQ(transition(from, ev), to) << state_name(from) << " + event " << int(ev);
}
}  // namespace

TEST(SessionState, QueuedStartsOrWaits) {
    expect(S::Queued, E::Start, S::Running);
    expect(S::Queued, E::AwaitInput, S::WaitingInput);
    expect(S::Running, E::Start, std::nullopt);
}

TEST(SessionState, ToolRoundTrip) {
    expect(S::Running, E::ToolsCalled, S::WaitingTool);
    expect(S::WaitingTool, E::ToolsDone, S::Running);
    expect(S::WaitingTool, E::ToolsCalled, std::nullopt);
    expect(S::Running, E::ToolsDone, std::nullopt);
}

TEST(SessionState, AnswerCompletes) {
    expect(S::Running, E::Answered, S::Completed);
    expect(S::WaitingTool, E::Answered, std::nullopt);
}

TEST(SessionState, UserMessageContinues) {
    expect(S::Completed, E::UserMessage, S::Running);
    expect(S::WaitingInput, E::UserMessage, S::Running);
    expect(S::Running, E::UserMessage, std::nullopt);
    expect(S::Failed, E::UserMessage, std::nullopt);
    expect(S::Cancelled, E::UserMessage, std::nullopt);
}

TEST(SessionState, LimitsAndErrorsFailLiveSessions) {
    for (S s : {S::Queued, S::Running, S::WaitingTool, S::WaitingInput}) {
        expect(s, E::LimitReached, S::Failed);
        expect(s, E::Error, S::Failed);
    }
    for (S s : {S::Completed, S::Failed, S::Cancelled}) {
        expect(s, E::LimitReached, std::nullopt);
        expect(s, E::Error, std::nullopt);
    }
}

TEST(SessionState, CancelEndsLiveSessions) {
    for (S s : {S::Queued, S::Running, S::WaitingTool, S::WaitingInput})
        expect(s, E::Cancel, S::Cancelled);
    for (S s : {S::Completed, S::Failed, S::Cancelled})
        expect(s, E::Cancel, std::nullopt);
}

TEST(SessionState, NamesRoundTrip) {
    for (S s : {S::Queued, S::Running, S::WaitingTool, S::WaitingInput, S::Completed, S::Failed, S::Cancelled}) {
        EXPECT_EQ(parse_state(state_name(s)), s);
    }
    EXPECT_EQ(parse_state("bogus"), std::nullopt);
    EXPECT_TRUE(has_ended(S::Completed));
    EXPECT_FALSE(is_final(S::Completed));
    EXPECT_TRUE(is_final(S::Failed));
}

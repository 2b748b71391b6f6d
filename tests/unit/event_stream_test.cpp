// A session's event stream: how events are numbered, what a client that comes back with
// Last-Event-ID is sent, and the steps of the log as events.
#include "agent/event_stream.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using armada::agent::EventId;
using armada::agent::EventStream;
using armada::agent::SessionEventRecord;
using armada::agent::step_event;
using armada::store::StepRecord;
using nlohmann::json;

namespace {

StepRecord step(int64_t seq, const std::string & kind, const json & payload) {
    StepRecord s;
    s.seq = seq;
    s.kind = kind;
    s.payload = payload.dump();
    return s;
}

StepRecord state_step(int64_t seq, const std::string & state) {
    return step(seq, "state", {{"state", state}});
}

std::vector<std::string> ids(const std::vector<SessionEventRecord> & evs) {
    std::vector<std::string> out;
    for (const auto & e : evs)
        out.push_back(e.id.text());
    return out;
}

}  // namespace

TEST(EventStream, EventsThatAreNotStoredAreNumberedAfterTheLastStep) {
    EventStream s;
    std::vector<std::string> seen;
    s.subscribe(1, [&](const SessionEventRecord & e) { seen.push_back(e.id.text() + " " + e.type); }, {});
    s.start_at({2, 0});
    s.transient("token", "{}");
    s.transient("token", "{}");
    s.deliver(*step_event(state_step(3, "running")));
    s.transient("token", "{}");
    EXPECT_EQ(seen, (std::vector<std::string>{"2.1 token", "2.2 token", "3 state", "3.1 token"}));
    EXPECT_EQ(s.last().text(), "3.1");
}

TEST(EventStream, AClientThatComesBackGetsWhatItMissedOnceAndInOrder) {
    EventStream s;
    s.start_at({2, 0});  // rebuilt from a log of two steps
    s.deliver(*step_event(state_step(3, "running")));
    s.transient("token", "{}");
    s.deliver(*step_event(state_step(4, "waiting_input")));
    // The store has steps 1..5; 5 is not delivered yet, so it comes live, not now.
    const std::vector<StepRecord> log = {state_step(1, "queued"), step(2, "user_input", {{"text", "hi"}}),
                                         state_step(3, "running"), state_step(4, "waiting_input"),
                                         state_step(5, "running")};
    EXPECT_EQ(ids(s.missed(log, {0, 0})), (std::vector<std::string>{"1", "3", "3.1", "4"}));
    EXPECT_EQ(ids(s.missed(log, {3, 0})), (std::vector<std::string>{"3.1", "4"}));
    EXPECT_EQ(ids(s.missed(log, {3, 1})), (std::vector<std::string>{"4"}));
    EXPECT_EQ(ids(s.missed(log, {4, 0})), (std::vector<std::string>{}));
    // Without the store (it could not be read), the recent events still come.
    EXPECT_EQ(ids(s.missed({}, {0, 0})), (std::vector<std::string>{"3", "3.1", "4"}));
}

TEST(EventStream, OnlyTheMostRecentEventsAreKept) {
    EventStream s;
    for (size_t i = 1; i <= EventStream::kKept + 3; ++i)
        s.transient("token", "{}");
    const auto kept = s.missed({}, {0, 0});
    ASSERT_EQ(kept.size(), EventStream::kKept);
    EXPECT_EQ(kept.front().id.text(), "0.4");
}

TEST(EventStream, EndingAndTakingOverSubscribers) {
    EventStream old;
    old.start_at({3, 0});
    int ended = 0;
    std::vector<std::string> seen;
    old.subscribe(
        1, [&](const SessionEventRecord & e) { seen.push_back(e.id.text()); }, [&] { ++ended; });
    EXPECT_TRUE(old.watched());
    // A newer copy from the store takes the subscribers, and sends them the steps the old one had
    // not delivered.
    EventStream fresh;
    fresh.take_over(old, {state_step(3, "running"), state_step(4, "waiting_input"), state_step(5, "running")});
    EXPECT_FALSE(old.watched());
    EXPECT_TRUE(fresh.watched());
    EXPECT_EQ(seen, (std::vector<std::string>{"4", "5"}));
    fresh.end();
    EXPECT_EQ(ended, 1);
    EXPECT_FALSE(fresh.watched());
    fresh.unsubscribe(1);
}

TEST(EventStream, StepsAsEvents) {
    const auto msg = step_event(step(
        4, "model_output",
        {{"content", ""}, {"tool_calls", json::array({{{"name", "lookup"}, {"arguments", "{}"}, {"id", "c1"}}})}}));
    ASSERT_TRUE(msg);
    EXPECT_EQ(msg->type, "message");
    const json m = json::parse(msg->data);
    EXPECT_TRUE(m["content"].is_null());
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "lookup");
    const auto failed = step_event(step(9, "state", {{"state", "failed"}, {"reason", "max_steps"}}));
    ASSERT_TRUE(failed);
    EXPECT_EQ(json::parse(failed->data)["reason"], "max_steps");
    EXPECT_FALSE(json::parse(step_event(state_step(2, "running"))->data).contains("reason"));
    // User input is not an event; a payload that is not an object is none; fields of another
    // type read as empty rather than throwing.
    EXPECT_FALSE(step_event(step(1, "user_input", {{"text", "hi"}})));
    StepRecord bad = state_step(3, "x");
    bad.payload = "[1]";
    EXPECT_FALSE(step_event(bad));
    const auto odd = step_event(step(5, "tool_result", {{"call_id", 7}, {"content", json::array()}}));
    ASSERT_TRUE(odd);
    EXPECT_EQ(json::parse(odd->data)["content"], "");
    EXPECT_EQ(EventId::parse("12.3")->text(), "12.3");
    EXPECT_FALSE(EventId::parse("12."));
}

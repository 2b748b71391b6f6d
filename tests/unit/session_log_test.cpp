// The agent's session log alone: rebuilding a session from its steps, and writing its batches one
// at a time, in order, through a store whose commits complete when the test says.

#include "agent/session_log.h"
#include "agent/session.h"
#include "mocks/scripted_table.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace armada;
using namespace armada::agent;
using json = nlohmann::json;

namespace {

//! The store's side of the log: keeps each commit until the test completes it.
class HeldCommits : public store::SessionLog {
  public:
    struct Held {
        store::Batch batch;
        std::function<void(store::Status)> done;
    };
    std::deque<Held> held;
    int recovers = 0;

    void commit(store::Batch batch, std::function<void(store::Status)> done) override {
        held.push_back({std::move(batch), std::move(done)});
    }
    std::optional<store::SessionRecord> session(const std::string &) override { return std::nullopt; }
    std::optional<store::ResponseRecord> response(const std::string &) override { return std::nullopt; }
    std::vector<store::StepRecord> steps(const std::string &) override { return {}; }
    std::optional<std::vector<store::AgentRecord>> agents() override { return std::vector<store::AgentRecord>{}; }
    store::Status recover() override {
        ++recovers;
        return {};
    }
    store::Status writable() override { return {}; }

    //! Completes the oldest commit with `st`.
    void complete(store::Status st = {}) {
        ASSERT_FALSE(held.empty());
        Held h = std::move(held.front());
        held.pop_front();
        h.done(st);
    }
};

class ScriptedLogHost : public armada::testing::ScriptedTable<SessionLog::Host> {
  public:
    std::vector<int> unlocked_delays;
    std::vector<std::string> fenced_why;
    int written_count = 0;

    void later_unlocked(int ms, std::function<void()> fn) override {
        unlocked_delays.push_back(ms);
        timers.emplace_back(ms, std::move(fn));
    }
    void fenced(Session &, const std::string & why) override { fenced_why.push_back(why); }
    void written(Session &) override { ++written_count; }
};

class FixedClock : public Clock {
  public:
    int64_t ms = 1000;
    int64_t now_ms() const override { return ms; }
};

store::StepRecord step(int64_t seq, const std::string & kind, const json & payload, const std::string & key = {}) {
    store::StepRecord r;
    r.session_id = "sess_r";
    r.seq = seq;
    r.kind = kind;
    r.payload = payload.dump();
    r.idempotency = key;
    return r;
}

struct SessionLogTest : ::testing::Test {
    HeldCommits store;
    ScriptedLogHost table;
    obs::Registry metrics;
    FixedClock clock;
    std::shared_ptr<std::atomic<bool>> alive = std::make_shared<std::atomic<bool>>(true);
    std::unique_ptr<SessionLog> log;

    void make_log(const std::string & node = {}) {
        log = std::make_unique<SessionLog>(table, store, metrics, clock, alive, SessionLog::Options{node, "cell0"});
    }
    Session & running(const std::string & id) {
        auto s = std::make_unique<Session>();
        s->id = id;
        s->agent_id = "worker";
        s->owner = "acme";
        s->state = SessionState::Running;
        s->log.logged = SessionState::Running;
        Session & ref = *s;
        table.sessions[id] = std::move(s);
        return ref;
    }
    //! Adds the types of the events the session's subscriber sees to `seen`.
    static void subscribe(Session & s, std::vector<std::string> & seen) {
        s.stream.subscribe(
            1, [&seen](const SessionEventRecord & ev) { seen.push_back(ev.type); }, [] {});
    }
};

}  // namespace

TEST_F(SessionLogTest, RebuildsTheConversationAndWhichCallsAreDone) {
    store::SessionRecord r;
    r.id = "sess_r";
    r.agent_id = "worker";
    r.owner = "acme";
    r.state = "waiting_tool";
    r.created_ms = 5;
    r.data = json{{"model_steps", 1}, {"prompt_tokens", 40}, {"completion_tokens", 9}, {"compactions", 2}}.dump();
    const std::vector<store::StepRecord> steps = {
        step(1, "user_input", {{"content", "find two things"}}),
        step(2, "state", {{"state", "running"}}),
        step(3, "model_output",
             {{"step", 1},
              {"kv_tokens", 49},
              {"content", ""},
              {"tool_calls",
               {{{"id", "call_1_0"}, {"name", "search"}, {"arguments", "{\"q\":1}"}},
                {{"id", "call_1_1"}, {"name", "fetch"}, {"arguments", "{}"}}}}}),
        step(4, "tool_call", {{"id", "call_1_0"}, {"name", "search"}, {"arguments", "{\"q\":1}"}}, "sess_r:1:0"),
        step(5, "tool_call", {{"id", "call_1_1"}, {"name", "fetch"}, {"arguments", "{}"}}, "sess_r:1:1"),
        step(6, "state", {{"state", "waiting_tool"}}),
        step(7, "tool_result", {{"call_id", "call_1_1"}, {"name", "fetch"}, {"content", "page"}}, "sess_r:1:1"),
        step(8, "garbage", "not an object"),
    };
    auto s = SessionLog::rebuild(r, steps, 100);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->state, SessionState::WaitingTool);
    EXPECT_EQ(s->log.logged, SessionState::WaitingTool);
    EXPECT_EQ(s->log.next_seq, 9);  // after the last step, even one it could not read
    EXPECT_EQ(s->stream.last().seq, 8);
    EXPECT_EQ(s->transcript.model_steps, 1);
    EXPECT_EQ(s->transcript.prompt_tokens, 40);
    EXPECT_EQ(s->transcript.compactions, 2);
    ASSERT_EQ(s->transcript.messages.size(), 3u);  // user, assistant with two calls, one tool result
    EXPECT_EQ(s->transcript.messages[0].content, "find two things");
    EXPECT_EQ(s->transcript.messages[1].tool_calls.size(), 2u);
    EXPECT_EQ(s->transcript.messages[2].tool_call_id, "call_1_1");
    ASSERT_EQ(s->tools.calls.size(), 2u);
    EXPECT_FALSE(s->tools.calls[0].done);  // goes out again, with its key
    EXPECT_EQ(s->tools.calls[0].call.idempotency_key, "sess_r:1:0");
    EXPECT_EQ(s->tools.calls[0].call.tenant, "acme");
    EXPECT_TRUE(s->tools.calls[1].done);  // its result is in the log: never sent again
    EXPECT_FALSE(s->tools.all_done());
    ASSERT_EQ(s->transcript.kv_history.size(), 1u);
    EXPECT_EQ(s->transcript.kv_history[0].bytes, 4900u);
    EXPECT_EQ(s->log.durable.transcript_len, 3u);

    r.state = "sideways";
    EXPECT_FALSE(SessionLog::rebuild(r, steps, 100));
}

TEST_F(SessionLogTest, TheRecordRoundTripsThroughARebuild) {
    make_log();
    Session & s = running("sess_t");
    s.transcript.model_steps = 3;
    s.transcript.completion_tokens = 77;
    s.transcript.dropped_tools = 4;
    clock.ms = 4242;
    const store::SessionRecord r = log->record(s);
    EXPECT_EQ(r.state, "running");
    EXPECT_EQ(r.updated_ms, 4242);
    EXPECT_EQ(r.cell, "cell0");
    auto back = SessionLog::rebuild(r, {}, 0);
    ASSERT_TRUE(back);
    EXPECT_EQ(back->transcript.model_steps, 3);
    EXPECT_EQ(back->transcript.completion_tokens, 77);
    EXPECT_EQ(back->transcript.dropped_tools, 4);
    EXPECT_EQ(back->log.next_seq, 1);
}

TEST_F(SessionLogTest, BatchesGoOneAtATimeInOrderAndBecomeEventsOnlyOnceDurable) {
    make_log();
    Session & s = running("sess_o");
    std::vector<std::string> seen;
    subscribe(s, seen);
    std::vector<int> after;

    store::Batch first;
    first.steps.push_back(log->step(s, "model_output", json{{"step", 1}, {"content", "hi"}}.dump()));
    s.state = SessionState::Completed;  // a change of state becomes a step of the same batch
    log->checkpoint(s, std::move(first), [&](Session &) { after.push_back(1); });
    store::Batch second;
    second.steps.push_back(log->step(s, "user_input", json{{"content", "more"}}.dump()));
    log->checkpoint(s, std::move(second), [&](Session &) { after.push_back(2); });

    ASSERT_EQ(store.held.size(), 1u);  // the second waits for the first
    const store::Batch & b = store.held[0].batch;
    ASSERT_EQ(b.steps.size(), 2u);
    EXPECT_EQ(b.steps[0].seq, 1);
    EXPECT_EQ(b.steps[1].kind, "state");
    EXPECT_EQ(b.steps[1].seq, 2);
    ASSERT_EQ(b.sessions.size(), 1u);
    EXPECT_EQ(b.sessions[0].state, "completed");
    EXPECT_TRUE(b.fences.empty());  // a single node fences nothing
    EXPECT_TRUE(seen.empty());
    EXPECT_TRUE(s.busy());

    store.complete();
    table.run_all_timers();
    EXPECT_EQ(after, std::vector<int>{1});
    EXPECT_EQ((std::vector<std::string>{"message", "state"}), seen);
    EXPECT_EQ(s.log.durable.state, SessionState::Completed);
    ASSERT_EQ(store.held.size(), 1u);                 // now the second
    EXPECT_EQ(store.held[0].batch.steps.size(), 1u);  // no state step: the state did not change again
    store.complete();
    table.run_all_timers();
    EXPECT_EQ(after, (std::vector<int>{1, 2}));
    EXPECT_EQ(table.written_count, 2);
    EXPECT_FALSE(s.busy());
}

TEST_F(SessionLogTest, AFailedBatchIsWrittenAgainAfterRecoveryAndNothingIsAcknowledgedBefore) {
    make_log();
    Session & s = running("sess_f");
    int after = 0;
    store::Batch b;
    b.steps.push_back(log->step(s, "user_input", json{{"content", "x"}}.dump()));
    log->checkpoint(s, std::move(b), [&](Session &) { ++after; });
    store.complete(store::Status::Error("disk full"));
    table.run_all_timers();  // the posted result, the pause (without the lock), the retry
    EXPECT_EQ(after, 0);
    EXPECT_EQ(store.recovers, 1);
    ASSERT_EQ(table.unlocked_delays.size(), 1u);
    EXPECT_GE(table.unlocked_delays[0], 1);
    EXPECT_EQ(log->failures(), 1);
    ASSERT_EQ(store.held.size(), 1u);  // the same batch again
    EXPECT_EQ(store.held[0].batch.steps[0].seq, 1);
    store.complete();
    table.run_all_timers();
    EXPECT_EQ(after, 1);
    EXPECT_EQ(s.log.commit_failures, 0);
}

TEST_F(SessionLogTest, InAClusterEveryBatchIsFencedOrClaimsAndARefusalStopsTheSession) {
    make_log("node-a");
    Session & s = running("sess_c");
    s.place.epoch = 4;
    log->persist(s, {}, [](Session &) {});
    ASSERT_EQ(store.held.size(), 1u);
    ASSERT_EQ(store.held[0].batch.fences.size(), 1u);
    EXPECT_EQ(store.held[0].batch.fences[0].node, "node-a");
    EXPECT_EQ(store.held[0].batch.fences[0].epoch, 4);
    store.complete();
    table.run_all_timers();

    s.place.claim = 6;  // taking it over from a node that is gone
    int after = 0;
    log->persist(s, {}, [&](Session &) { ++after; });
    ASSERT_EQ(store.held[0].batch.assign.size(), 1u);
    EXPECT_EQ(store.held[0].batch.assign[0].epoch, 7);
    EXPECT_EQ(store.held[0].batch.assign[0].cell, "cell0");
    store.complete();
    table.run_all_timers();
    EXPECT_EQ(s.place.epoch, 7);
    EXPECT_EQ(s.place.claim, -1);
    EXPECT_EQ(after, 1);

    log->persist(s, {}, [&](Session &) { ++after; });
    store.complete(store::Status::Fenced("node-b holds it under epoch 8"));
    table.run_all_timers();
    EXPECT_EQ(after, 1);  // never runs
    ASSERT_EQ(table.fenced_why.size(), 1u);
    EXPECT_EQ(table.fenced_why[0], "node-b holds it under epoch 8");
}

TEST_F(SessionLogTest, NoCommitReachesATableThatIsGone) {
    make_log();
    Session & s = running("sess_g");
    log->persist(s, {}, [](Session &) {});
    *alive = false;
    store.complete();
    EXPECT_TRUE(table.timers.empty());
}

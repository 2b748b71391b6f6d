// The tool runner alone: a scripted host (its timers and the store's confirmations run when the
// test says), a transport that records every call it is given, and an engine that records holds.

#include "agent/tool_runner.h"
#include "agent/session.h"
#include "mocks/scripted_table.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace armada;
using namespace armada::agent;

namespace {

class ScriptedHost : public armada::testing::ScriptedTable<ToolRunner::Host> {
  public:
    std::vector<std::function<void(Session &)>> confirms;  // fenced writes asked for
    std::string confirm_for;
    bool calls_allowed = true;
    struct Finished {
        std::string key, content;
        bool is_error = false, all = false;
        int attempts = 0;
    };
    std::vector<Finished> finished_calls;
    int strays = 0;

    bool may_call(const Session &) const override { return calls_allowed; }
    void confirm_held(Session & s, std::function<void(Session &)> then) override {
        confirm_for = s.id;
        confirms.push_back(std::move(then));
    }
    void finished(Session &, const PendingCall & pc, const tools::ToolResult & r, bool all) override {
        finished_calls.push_back({pc.call.idempotency_key, r.content, r.is_error, all, pc.sent_before + r.attempts});
    }
    void stray_result(Session &) override { ++strays; }
};

class RecordingTransport : public tools::ToolTransport {
  public:
    struct Sent {
        std::string tool;
        int32_t timeout_ms = 0;
        tools::ToolCall call;
        std::function<void(tools::ToolResult)> done;
    };
    std::vector<Sent> sent;
    void call(const HttpToolSpec & spec, const tools::ToolCall & call,
              std::function<void(tools::ToolResult)> done) override {
        sent.push_back({spec.name, spec.timeout_ms, call, std::move(done)});
    }
};

class HoldingEngine : public GenerationPort {
  public:
    std::vector<std::pair<std::string, int64_t>> holds;
    engine::SubmitStatus submit(std::unique_ptr<engine::GenRequest>) override { return engine::SubmitStatus::Stopped; }
    void wake() override {}
    int32_t n_ctx_seq() const override { return 0; }
    void hold(const std::string & session, int64_t ms) override { holds.emplace_back(session, ms); }
};

tools::ToolResult result(const std::string & content, int attempts = 1, double latency_s = 0.05) {
    tools::ToolResult r;
    r.content = content;
    r.attempts = attempts;
    r.latency_s = latency_s;
    return r;
}

struct ToolRunnerTest : ::testing::Test {
    ScriptedHost host;
    RecordingTransport transport;
    HoldingEngine engine;
    obs::Registry metrics;
    std::shared_ptr<std::atomic<bool>> alive = std::make_shared<std::atomic<bool>>(true);
    bool lease = true;
    std::unique_ptr<ToolRunner> runner;

    void make_runner(bool with_lease) {
        ToolRunner::Options o;
        if (with_lease) o.lease_current = [this] { return lease; };
        runner = std::make_unique<ToolRunner>(host, transport, engine, metrics, alive, o);
    }

    //! A session of `tenant` waiting on calls to `tools` (keys sess:1:0, sess:1:1, …).
    Session & waiting(const std::string & id, const std::vector<std::string> & tools,
                      const std::string & tenant = "acme") {
        auto spec = std::make_shared<AgentSpec>();
        spec->id = "worker";
        spec->limits.tool_timeout_ms = 4000;
        for (const char * name : {"search", "fetch"}) {
            HttpToolSpec t;
            t.name = name;
            t.url = "http://127.0.0.1:9/" + std::string(name);
            t.timeout_ms = 10000;
            spec->tools.push_back(t);
        }
        auto s = std::make_unique<Session>();
        s->id = id;
        s->agent_id = "worker";
        s->owner = tenant;
        s->agent = spec;
        s->state = SessionState::WaitingTool;
        s->place.started = true;
        for (size_t i = 0; i < tools.size(); ++i) {
            PendingCall pc;
            pc.call.session_id = id;
            pc.call.call_id = "call_" + std::to_string(i);
            pc.call.name = tools[i];
            pc.call.arguments = "{}";
            pc.call.tenant = tenant;
            pc.call.idempotency_key = id + ":1:" + std::to_string(i);
            s->tools.calls.push_back(pc);
        }
        Session & ref = *s;
        host.sessions[id] = std::move(s);
        return ref;
    }
};

}  // namespace

TEST_F(ToolRunnerTest, SendsEachCallOnceWithTheAgentsCapAndSkipsFinishedOnes) {
    make_runner(false);
    Session & s = waiting("sess_a", {"search", "fetch"});
    s.tools.calls[0].done = true;  // its result is in the log already (a resumed session)
    runner->run(s);
    ASSERT_EQ(transport.sent.size(), 1u);
    EXPECT_EQ(transport.sent[0].tool, "fetch");
    EXPECT_EQ(transport.sent[0].call.idempotency_key, "sess_a:1:1");
    EXPECT_EQ(transport.sent[0].call.tenant, "acme");
    EXPECT_EQ(transport.sent[0].timeout_ms, 4000);  // the agent's cap beats the tool's 10 s
    EXPECT_FALSE(transport.sent[0].call.traceparent.empty());
    EXPECT_EQ(s.tools.in_flight, 1);
    runner->run(s);  // a second start (a repeated resume) sends nothing twice
    EXPECT_EQ(transport.sent.size(), 1u);

    transport.sent[0].done(result("found"));
    ASSERT_EQ(host.timers.size(), 1u);  // the result is posted, not handled on the I/O thread
    EXPECT_TRUE(host.finished_calls.empty());
    host.run_timers();
    ASSERT_EQ(host.finished_calls.size(), 1u);
    EXPECT_EQ(host.finished_calls[0].key, "sess_a:1:1");
    EXPECT_EQ(host.finished_calls[0].content, "found");
    EXPECT_TRUE(host.finished_calls[0].all);
    EXPECT_EQ(s.tools.in_flight, 0);

    // The same result again (a duplicate callback) is not recorded twice.
    runner->on_result("sess_a", "sess_a:1:1", result("found"));
    EXPECT_EQ(host.finished_calls.size(), 1u);
}

TEST_F(ToolRunnerTest, TheLastOfSeveralCallsIsTheOneThatSaysAll) {
    make_runner(false);
    Session & s = waiting("sess_b", {"search", "fetch"});
    runner->run(s);
    ASSERT_EQ(transport.sent.size(), 2u);
    transport.sent[1].done(result("second"));
    transport.sent[0].done(result("first"));
    host.run_timers();
    ASSERT_EQ(host.finished_calls.size(), 2u);
    EXPECT_FALSE(host.finished_calls[0].all);
    EXPECT_TRUE(host.finished_calls[1].all);
}

TEST_F(ToolRunnerTest, NoCallGoesOutUntilTheLeaseIsCurrentAndTheStoreConfirmsTheSession) {
    make_runner(true);
    lease = false;
    Session & s = waiting("sess_c", {"search"});
    runner->run(s);
    EXPECT_TRUE(transport.sent.empty());
    EXPECT_TRUE(s.tools.lease_wait);
    runner->run(s);  // one wait per session, however often it is started
    ASSERT_EQ(host.timers.size(), 1u);
    EXPECT_EQ(host.timers[0].first, 100);

    EXPECT_EQ(host.run_timers(), std::vector<int>{100});  // still not current: it looks again
    EXPECT_TRUE(transport.sent.empty());
    EXPECT_TRUE(host.confirms.empty());
    ASSERT_EQ(host.timers.size(), 1u);

    lease = true;
    host.run_timers();  // current now, but the session may have moved on meanwhile
    EXPECT_TRUE(transport.sent.empty());
    ASSERT_EQ(host.confirms.size(), 1u);
    EXPECT_EQ(host.confirm_for, "sess_c");

    host.confirms[0](s);  // the fenced write of nothing went through: it is still ours
    ASSERT_EQ(transport.sent.size(), 1u);
    EXPECT_FALSE(s.tools.lease_wait);
    // Its retries ask the lease too.
    ASSERT_TRUE(transport.sent[0].call.may_send);
    lease = false;
    EXPECT_FALSE(transport.sent[0].call.may_send());
}

TEST_F(ToolRunnerTest, AWaitEndsWithoutACallWhenTheSessionStopsWaitingOrMayNotCall) {
    make_runner(true);
    lease = false;
    Session & s = waiting("sess_d", {"search"});
    runner->run(s);
    s.place.started = false;  // a copy only loaded to be read: another node runs it
    lease = true;
    host.run_timers();
    EXPECT_FALSE(s.tools.lease_wait);
    EXPECT_TRUE(host.confirms.empty());
    EXPECT_TRUE(host.timers.empty());

    Session & t = waiting("sess_e", {"search"});
    lease = false;
    runner->run(t);
    host.calls_allowed = false;  // the node began to drain
    lease = true;
    host.run_timers();
    EXPECT_FALSE(t.tools.lease_wait);
    EXPECT_TRUE(host.confirms.empty());
    EXPECT_TRUE(transport.sent.empty());

    host.calls_allowed = true;
    host.sessions.erase("sess_e");  // gone from the table: the timer finds nothing
    Session & u = waiting("sess_f", {"search"});
    lease = false;
    runner->run(u);
    host.sessions.erase("sess_f");
    lease = true;
    host.run_timers();
    EXPECT_TRUE(host.confirms.empty());
    EXPECT_TRUE(transport.sent.empty());
}

TEST_F(ToolRunnerTest, ARetryThatCameBackUnsentWaitsForTheLeaseAndKeepsItsAttempts) {
    make_runner(true);
    Session & s = waiting("sess_g", {"search"});
    runner->run(s);
    ASSERT_EQ(transport.sent.size(), 1u);
    tools::ToolResult unsent;
    unsent.not_sent = true;
    unsent.attempts = 2;  // two tries went out before the lease lapsed
    lease = false;
    transport.sent[0].done(unsent);
    host.run_timers();
    EXPECT_TRUE(host.finished_calls.empty());  // not a result
    EXPECT_FALSE(s.tools.calls[0].started);
    EXPECT_EQ(s.tools.calls[0].sent_before, 2);
    EXPECT_TRUE(s.tools.lease_wait);

    lease = true;
    host.run_timers();
    ASSERT_EQ(host.confirms.size(), 1u);
    host.confirms[0](s);
    ASSERT_EQ(transport.sent.size(), 2u);
    EXPECT_EQ(transport.sent[1].call.idempotency_key, "sess_g:1:0");  // the same key
    transport.sent[1].done(result("late but fine"));
    host.run_timers();
    ASSERT_EQ(host.finished_calls.size(), 1u);
    EXPECT_EQ(host.finished_calls[0].attempts, 3);
}

TEST_F(ToolRunnerTest, AResultForASessionNoLongerWaitingIsStrayAndAnUnknownToolIsAnError) {
    make_runner(false);
    Session & s = waiting("sess_h", {"search"});
    runner->run(s);
    s.state = SessionState::Cancelled;
    transport.sent[0].done(result("too late"));
    host.run_timers();
    EXPECT_EQ(host.strays, 1);
    EXPECT_TRUE(host.finished_calls.empty());
    EXPECT_EQ(s.tools.in_flight, 0);

    Session & t = waiting("sess_i", {"made_up"});
    runner->run(t);
    EXPECT_EQ(transport.sent.size(), 1u);  // nothing sent for it
    host.run_timers();
    ASSERT_EQ(host.finished_calls.size(), 1u);
    EXPECT_TRUE(host.finished_calls[0].is_error);
    EXPECT_NE(host.finished_calls[0].content.find("no tool named 'made_up'"), std::string::npos);
}

TEST_F(ToolRunnerTest, KvIsHeldForWhatThisTenantsToolUsuallyTakes) {
    make_runner(false);
    for (int i = 0; i < 3; ++i) {
        Session & s = waiting("sess_j" + std::to_string(i), {"search"});
        runner->run(s);
        transport.sent.back().done(result("ok", 1, 0.2));
        host.run_timers();
    }
    ASSERT_EQ(engine.holds.size(), 3u);
    const int64_t unseen = engine::KvHold::Options{}.default_ms;
    EXPECT_EQ(engine.holds[0].second, unseen);
    engine.holds.clear();

    Session & mine = waiting("sess_k", {"search"});
    runner->run(mine);
    Session & theirs = waiting("sess_l", {"search"}, "other");
    runner->run(theirs);
    ASSERT_EQ(engine.holds.size(), 2u);
    EXPECT_EQ(engine.holds[0].first, "sess_k");
    EXPECT_EQ(engine.holds[0].second, 200 + engine::KvHold::Options{}.margin_ms);  // learned
    EXPECT_EQ(engine.holds[1].second, unseen);  // another tenant's tool of the same name
}

TEST_F(ToolRunnerTest, NoResultReachesATableThatIsGone) {
    make_runner(false);
    Session & s = waiting("sess_m", {"search"});
    runner->run(s);
    *alive = false;
    transport.sent[0].done(result("after the end"));
    EXPECT_TRUE(host.timers.empty());
}

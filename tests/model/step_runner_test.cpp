// The step runner alone, on the tiny model's chat format: a scripted host (its timers run when the
// test says), an engine that keeps each request for the test to answer through its sink, and a
// pool whose routing and answers the test sets.

#include "agent/step_runner.h"
#include "agent/session.h"
#include "mocks/scripted_table.h"
#include "model/tiny_model.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <boost/asio/io_context.hpp>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace armada;
using namespace armada::agent;
using json = nlohmann::json;

namespace {

class ScriptedHost : public armada::testing::ScriptedTable<StepRunner::Host> {
  public:
    bool steps_allowed = true;
    std::vector<std::pair<SessionEvent, std::string>> failures;
    std::vector<json> outputs;

    void locked(const std::function<void()> & fn) override { fn(); }
    bool may_call(const Session &) const override { return steps_allowed; }
    void fail(Session & s, SessionEvent ev, const std::string & reason) override {
        failures.emplace_back(ev, reason);
        s.state = SessionState::Failed;
    }
    void stepped(Session &, const std::string & output) override { outputs.push_back(json::parse(output)); }
};

class KeepingEngine : public GenerationPort {
  public:
    std::vector<std::unique_ptr<engine::GenRequest>> requests;
    engine::SubmitStatus answer = engine::SubmitStatus::Accepted;
    std::vector<std::string> released;
    engine::SubmitStatus submit(std::unique_ptr<engine::GenRequest> req) override {
        if (answer == engine::SubmitStatus::Accepted) requests.push_back(std::move(req));
        return answer;
    }
    void wake() override {}
    int32_t n_ctx_seq() const override { return 2048; }
    void release(const std::string & session, bool) override { released.push_back(session); }
};

class ScriptedPool : public StepPool {
  public:
    std::string to;  // where every step goes ("": here)
    struct Run {
        PoolStep step;
        std::function<void(std::string)> on_text;
        std::function<void(PoolStepResult)> done;
    };
    std::vector<Run> runs;
    std::string route(const StepFacts &) const override { return to; }
    int64_t context(const std::string &) const override { return 32768; }
    void run(PoolStep step, std::function<void(std::string)> on_text,
             std::function<void(PoolStepResult)> done) override {
        runs.push_back({std::move(step), std::move(on_text), std::move(done)});
    }
};

engine::GenEvent done_event(engine::FinishReason finish = engine::FinishReason::Stop, const std::string & error = {}) {
    engine::GenEvent ev;
    ev.kind = engine::GenEvent::Kind::Done;
    ev.finish = finish;
    ev.error = error;
    ev.n_prompt = 30;
    ev.n_generated = 4;
    ev.kv_tokens = 34;
    return ev;
}

engine::GenEvent text_event(const std::string & text) {
    engine::GenEvent ev;
    ev.kind = engine::GenEvent::Kind::Text;
    ev.text = text;
    return ev;
}

struct StepRunnerTest : ::testing::Test {
    static engine::ChatFormat & format() {
        static engine::ChatFormat f(armada::testing::tiny_model());
        return f;
    }
    boost::asio::io_context io;  // first: the requests and pool runs below hold strands of it
    ScriptedHost host;
    KeepingEngine engine;
    ScriptedPool pool;
    obs::Registry metrics;
    SystemClock clock;
    std::shared_ptr<std::atomic<bool>> alive = std::make_shared<std::atomic<bool>>(true);
    std::unique_ptr<StepRunner> runner;

    void make_runner(bool with_pool = false) {
        StepRunner::Options o;
        o.model = "tiny";
        if (with_pool) o.pool = &pool;
        runner = std::make_unique<StepRunner>(host, format(), engine, metrics, clock, io.get_executor(), alive, o);
    }
    Session & running(const std::string & id, int32_t max_steps = 10) {
        auto spec = std::make_shared<AgentSpec>();
        spec->id = "worker";
        spec->instructions =
            "You are a careful assistant for the operations team. Answer briefly, cite the tool you used, and "
            "never guess a number you were not given.";  // long enough to share (16 tokens at least)
        spec->limits.max_steps = max_steps;
        spec->limits.max_tokens_per_step = 16;
        auto s = std::make_unique<Session>();
        s->id = id;
        s->agent_id = "worker";
        s->owner = "acme";
        s->agent = spec;
        s->state = SessionState::Running;
        s->created_ms = clock.now_ms();
        common_chat_msg u;
        u.role = "user";
        u.content = "hello";
        s->transcript.messages.push_back(u);
        Session & ref = *s;
        host.sessions[id] = std::move(s);
        return ref;
    }
    //! Sends `ev` through the newest request's sink, and runs what it handed over.
    void engine_says(engine::GenEvent ev, size_t which = SIZE_MAX) {
        auto & req = which == SIZE_MAX ? engine.requests.back() : engine.requests.at(which);
        req->sink(std::move(ev));
        io.restart();
        io.poll();
    }
};

}  // namespace

TEST_F(StepRunnerTest, AStepGoesToTheEngineAsTheSessionsAndItsReplyToTheHost) {
    make_runner();
    Session & s = running("sess_a");
    runner->run(s);
    ASSERT_EQ(engine.requests.size(), 1u);
    EXPECT_EQ(engine.requests[0]->session, "sess_a");
    EXPECT_EQ(engine.requests[0]->tenant, "acme");
    EXPECT_GT(engine.requests[0]->prefix_len, 0);  // the instructions every session of the agent shares
    EXPECT_TRUE(s.gen.cancel);                     // busy while it runs
    EXPECT_TRUE(s.trace.turn.has_value());

    engine_says(text_event("Hi"));
    engine_says(text_event(" there"));
    EXPECT_TRUE(host.outputs.empty());
    engine_says(done_event());
    ASSERT_EQ(host.outputs.size(), 1u);
    EXPECT_EQ(host.outputs[0]["content"].get<std::string>(), "Hi there");
    EXPECT_EQ(host.outputs[0]["step"].get<int>(), 1);
    EXPECT_EQ(host.outputs[0]["ran_on"].get<std::string>(), "cpu");
    EXPECT_EQ(s.transcript.model_steps, 1);
    EXPECT_EQ(s.transcript.prompt_tokens, 30);
    EXPECT_EQ(s.transcript.messages.back().role, "assistant");
    EXPECT_TRUE(s.tools.calls.empty());
    EXPECT_FALSE(s.gen.cancel);
    EXPECT_EQ(runner->steps(), 1);
}

TEST_F(StepRunnerTest, ALimitEndsTheSessionInsteadOfAStep) {
    make_runner();
    Session & s = running("sess_b", 2);
    s.transcript.model_steps = 2;
    runner->run(s);
    EXPECT_TRUE(engine.requests.empty());
    ASSERT_EQ(host.failures.size(), 1u);
    EXPECT_EQ(host.failures[0].first, SessionEvent::LimitReached);
    EXPECT_EQ(host.failures[0].second, "max_steps (2) reached");

    Session & t = running("sess_c");
    host.steps_allowed = false;  // draining: the step waits for the next start
    runner->run(t);
    EXPECT_TRUE(engine.requests.empty());
    EXPECT_EQ(host.failures.size(), 1u);
}

TEST_F(StepRunnerTest, AFullEngineIsAskedAgainAndAFailingOneTwiceMore) {
    make_runner();
    Session & s = running("sess_d");
    engine.answer = engine::SubmitStatus::QueueFull;
    runner->run(s);
    EXPECT_TRUE(engine.requests.empty());
    EXPECT_FALSE(s.gen.cancel);
    engine.answer = engine::SubmitStatus::Accepted;
    EXPECT_EQ(host.run_timers(), std::vector<int>{200});
    ASSERT_EQ(engine.requests.size(), 1u);

    engine_says(done_event(engine::FinishReason::Error, "decode failed"));
    engine_says(done_event(engine::FinishReason::Error, "decode failed"));
    EXPECT_TRUE(host.failures.empty());  // tried again, twice
    ASSERT_EQ(engine.requests.size(), 3u);
    engine_says(done_event(engine::FinishReason::Error, "decode failed"));
    ASSERT_EQ(host.failures.size(), 1u);
    EXPECT_EQ(host.failures[0].second, "the model failed: decode failed");
    EXPECT_EQ(runner->errors(), 3);
}

TEST_F(StepRunnerTest, AnEventOfAStepThatIsNoLongerUnderWayIsDropped) {
    make_runner();
    Session & s = running("sess_e");
    runner->run(s);
    s.state = SessionState::Cancelled;  // cancelled while the step ran
    engine_says(done_event());
    EXPECT_TRUE(host.outputs.empty());

    s.state = SessionState::Running;
    runner->run(s);  // a newer step
    ASSERT_EQ(engine.requests.size(), 2u);
    engine_says(text_event("stale"), 0);
    engine_says(done_event(), 0);
    EXPECT_TRUE(host.outputs.empty());
    engine_says(text_event("fresh"), 1);
    engine_says(done_event(), 1);
    ASSERT_EQ(host.outputs.size(), 1u);
    EXPECT_EQ(host.outputs[0]["content"].get<std::string>(), "fresh");
}

TEST_F(StepRunnerTest, APoolThatCannotRunTheStepLeavesItToThisNode) {
    make_runner(true);
    pool.to = "gpu";
    Session & s = running("sess_f");
    runner->run(s);
    EXPECT_TRUE(engine.requests.empty());
    ASSERT_EQ(pool.runs.size(), 1u);
    EXPECT_EQ(pool.runs[0].step.pool, "gpu");
    EXPECT_EQ(pool.runs[0].step.tenant, "acme");
    EXPECT_EQ(engine.released, std::vector<std::string>{"sess_f"});  // its KV leaves the sequences meanwhile

    PoolStepResult no;
    no.error = "every upstream is down";
    pool.runs[0].done(no);
    io.restart();
    io.poll();
    ASSERT_EQ(engine.requests.size(), 1u);  // the prompt fits here
    engine_says(text_event("local"));
    engine_says(done_event());
    ASSERT_EQ(host.outputs.size(), 1u);
    EXPECT_EQ(host.outputs[0]["ran_on"].get<std::string>(), "cpu");
    EXPECT_EQ(host.outputs[0]["pool_fallback"].get<std::string>(), "gpu-unavailable");
}

TEST_F(StepRunnerTest, APoolsStreamThatBreaksOffIsVoidedAndItsAnswerTaken) {
    make_runner(true);
    pool.to = "gpu";
    Session & s = running("sess_g");
    runner->run(s);
    ASSERT_EQ(pool.runs.size(), 1u);
    pool.runs[0].on_text("half an ans");
    pool.runs[0].on_text("");  // the upstream failed midway
    io.restart();
    io.poll();
    EXPECT_TRUE(s.gen.text.empty());
    PoolStepResult ok;
    ok.ran = true;
    ok.text = "a whole answer";
    ok.upstream = "big-model";
    pool.runs[0].done(ok);
    io.restart();
    io.poll();
    ASSERT_EQ(host.outputs.size(), 1u);
    EXPECT_EQ(host.outputs[0]["content"].get<std::string>(), "a whole answer");
    EXPECT_EQ(host.outputs[0]["ran_on"].get<std::string>(), "gpu");
    EXPECT_EQ(host.outputs[0]["upstream"].get<std::string>(), "big-model");
}

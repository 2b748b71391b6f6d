// The engine's admission order under each scheduling policy, and the KV hold across a tool call,
// on the real tiny model (label: model).
#include "engine/engine.h"
#include "model/greedy.h"
#include "model/tiny_model.h"
#include "obs/metrics.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using namespace armada::engine;
using armada::testing::greedy_request;
using armada::testing::run_to_end;
using armada::testing::tiny_model;

namespace {

Tokens prompt_for(int i, int len) {
    Tokens p;
    for (int k = 0; k < len; ++k)
        p.push_back(llama_token(700 + (i * 131 + k * 17) % 30000));
    return p;
}

std::unique_ptr<GenRequest> program_request(const Model & m, int i, int len, const std::string & program) {
    auto r = greedy_request(m, prompt_for(i, len), 4);
    r->program = program;
    r->tenant = "t";
    return r;
}

//! The order in which one sequence served three waiting programs: heavy (first seen, 300 tokens
//! of service), mid (seen next, 100 tokens) and light (new). They are submitted as mid, light,
//! heavy while a blocker holds the only sequence: its Done event waits until all three are in.
std::vector<std::string> served_order(SchedPolicy policy, int32_t starve_ms) {
    auto m = tiny_model();
    EngineConfig cfg;
    cfg.n_seq_max = 1;
    cfg.n_ctx = 1024;
    cfg.n_threads = 2;
    cfg.prefix_cache = false;
    cfg.sched = policy;
    cfg.sched_starve_ms = starve_ms;
    Engine e(m, cfg, nullptr);
    EXPECT_EQ(e.start(), "");
    run_to_end(e, program_request(*m, 1, 300, "heavy"));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // first seen at distinct milliseconds
    run_to_end(e, program_request(*m, 2, 100, "mid"));

    std::mutex mu;
    std::condition_variable cv;
    bool submitted = false, blocker_done = false;
    std::vector<std::string> order;
    int done = 0;
    auto blocker = program_request(*m, 3, 20, "blocker");
    blocker->sink = [&](GenEvent && ev) {
        if (ev.kind != GenEvent::Kind::Done) return;
        std::unique_lock lk(mu);
        blocker_done = true;
        cv.notify_all();
        cv.wait(lk, [&] { return submitted; });  // the engine thread waits here, its sequence still busy
    };
    EXPECT_EQ(e.submit(std::move(blocker)), SubmitStatus::Accepted);
    {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return blocker_done; });
    }
    int i = 10;
    for (const char * p : {"mid", "light", "heavy"}) {
        auto r = program_request(*m, i++, 40, p);
        r->sink = [&, name = std::string(p)](GenEvent && ev) {
            if (ev.kind != GenEvent::Kind::Done) return;
            std::lock_guard lk(mu);
            order.push_back(name);
            ++done;
            cv.notify_all();
        };
        EXPECT_EQ(e.submit(std::move(r)), SubmitStatus::Accepted);
    }
    {
        std::unique_lock lk(mu);
        submitted = true;
        cv.notify_all();
        cv.wait(lk, [&] { return done == 3; });
    }
    e.stop();
    return order;
}

}  // namespace

TEST(SchedulerModel, PlasAdmitsTheProgramWithTheLeastServiceFirst) {
    EXPECT_EQ(served_order(SchedPolicy::Plas, 60000), (std::vector<std::string>{"light", "mid", "heavy"}));
}

TEST(SchedulerModel, ProgramFcfsAdmitsTheOldestProgramFirst) {
    EXPECT_EQ(served_order(SchedPolicy::ProgramFcfs, 60000), (std::vector<std::string>{"heavy", "mid", "light"}));
}

TEST(SchedulerModel, FcfsAdmitsInArrivalOrder) {
    EXPECT_EQ(served_order(SchedPolicy::Fcfs, 60000), (std::vector<std::string>{"mid", "light", "heavy"}));
}

TEST(SchedulerModel, StarvedRequestsGoInArrivalOrderWhateverThePolicy) {
    // Every request has waited past a 1 ms limit by the time the sequence is free.
    EXPECT_EQ(served_order(SchedPolicy::Plas, 1), (std::vector<std::string>{"mid", "light", "heavy"}));
}

namespace {

struct HoldFixture {
    std::shared_ptr<Model> m = tiny_model();
    armada::obs::Registry metrics;
    std::unique_ptr<Engine> e;

    explicit HoldFixture(int32_t seqs, int32_t grace_ms = 100) {
        EngineConfig cfg;
        cfg.n_seq_max = seqs;
        cfg.n_ctx = 512 * seqs;
        cfg.n_threads = 2;
        cfg.park_grace_ms = grace_ms;
        cfg.prefix_cache = false;
        cfg.kv_journal = false;
        e = std::make_unique<Engine>(m, cfg, &metrics);
        EXPECT_EQ(e->start(), "");
    }
    ~HoldFixture() { e->stop(); }
    void step(const std::string & session, int i) {
        auto r = greedy_request(*m, prompt_for(i, 60), 4);
        r->session = session;
        r->tenant = "t";
        run_to_end(*e, std::move(r));
    }
    uint64_t holds(const std::string & outcome) {
        return metrics.counter("armada_kv_holds_total", "", {{"outcome", outcome}}).value();
    }
    //! Waits until `pred` holds, up to 10 s.
    template <class P>
    bool until(P pred) {
        for (int k = 0; k < 1000; ++k) {
            if (pred()) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return pred();
    }
};

}  // namespace

TEST(KvHoldModel, AHeldSessionIsNotParkedUntilItsTimeIsUp) {
    HoldFixture f(2);
    f.step("s1", 1);
    f.e->hold("s1", 1500);
    const auto t0 = std::chrono::steady_clock::now();
    // The idle grace is 100 ms; the hold keeps the KV unparked well past it.
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    EXPECT_EQ(f.e->stats().parks.load(), 0u);
    ASSERT_TRUE(f.until([&] { return f.e->stats().parks.load() == 1; }));
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1400));
    EXPECT_EQ(f.holds("expired"), 1u);
}

TEST(KvHoldModel, AHoldOfZeroParksAtOnceAndASessionBackInTimeKeepsItsSequence) {
    HoldFixture f(2, /*grace_ms=*/60000);  // only the hold can park it within the test
    f.step("s1", 1);
    f.e->hold("s1", 0);
    ASSERT_TRUE(f.until([&] { return f.e->stats().parks.load() == 1; }));
    EXPECT_EQ(f.holds("none"), 1u);

    f.step("s2", 2);
    f.e->hold("s2", 30000);
    f.step("s2", 2);  // back before its time is up: its own sequence, nothing parked or restored
    EXPECT_EQ(f.holds("kept"), 1u);
    EXPECT_EQ(f.e->stats().parks.load(), 1u);
}

TEST(KvHoldModel, AnotherProgramTakesAHeldSequenceOnlyWhenNoOtherIsFree) {
    HoldFixture f(2, /*grace_ms=*/60000);  // nothing parks by idling during the test
    f.step("s1", 1);
    f.e->hold("s1", 30000);
    f.step("s2", 2);  // the other sequence is free: s1's stays held
    f.step("s3", 3);  // s2 idles unheld: its sequence goes before s1's held one
    EXPECT_EQ(f.holds("taken"), 0u);
    ASSERT_TRUE(f.e->kv_usage("s1"));
    EXPECT_EQ(f.e->kv_usage("s1")->where, "slot");
    ASSERT_TRUE(f.e->kv_usage("s2"));
    EXPECT_EQ(f.e->kv_usage("s2")->where, "ram");
    f.e->hold("s3", 60000);
    f.step("s4", 4);  // both held: the one due first (s1) is parked and taken
    EXPECT_EQ(f.holds("taken"), 1u);
    ASSERT_TRUE(f.e->kv_usage("s1"));
    EXPECT_EQ(f.e->kv_usage("s1")->where, "ram");
    ASSERT_TRUE(f.e->kv_usage("s3"));
    EXPECT_EQ(f.e->kv_usage("s3")->where, "slot");
}

namespace {

//! An engine for anonymous chat calls: `seqs` sequences, nothing parked or journaled.
EngineConfig chat_config(int32_t seqs) {
    EngineConfig cfg;
    cfg.n_seq_max = seqs;
    cfg.n_ctx = 2048;
    cfg.n_threads = 2;
    cfg.park = false;
    cfg.kv_journal = false;
    return cfg;
}

}  // namespace

TEST(SchedulerModel, AConversationThatNamesNoProgramIsKnownByTheChainItExtends) {
    // One sequence, so each conversation's KV goes to the prompt cache when the other takes it:
    // a later turn finds the conversation there, or in the sequence when nobody took it meanwhile.
    auto m = tiny_model();
    EngineConfig cfg = chat_config(1);
    cfg.sched = SchedPolicy::Plas;
    Engine e(m, cfg, nullptr);
    ASSERT_EQ(e.start(), "");
    const Tokens system = prompt_for(0, 64);  // shared by both conversations
    auto turn = [&](Tokens & conv, int user) {
        conv = armada::testing::concat(conv, prompt_for(user, 24));
        auto r = greedy_request(*m, conv, 8);
        r->tenant = "t";
        run_to_end(e, std::move(r));
    };
    Tokens a = system, b = system;
    turn(a, 1);
    turn(b, 2);
    EXPECT_EQ(e.stats().programs.load(), 2);
    turn(a, 3);  // from the cache entry A's turn 1 left
    turn(b, 4);
    turn(b, 5);  // from its own sequence
    EXPECT_EQ(e.stats().programs.load(), 2);
    // A third conversation with the same system prompt is a program of its own.
    Tokens c = system;
    turn(c, 6);
    EXPECT_EQ(e.stats().programs.load(), 3);
    turn(c, 8);  // its turn 6 is only in the sequence: no cache entry has it yet
    EXPECT_EQ(e.stats().programs.load(), 3);
    // A named program is its own whatever its prompt extends.
    auto named = greedy_request(*m, armada::testing::concat(c, prompt_for(7, 8)), 4);
    named->tenant = "t";
    named->program = "conv-c";
    run_to_end(e, std::move(named));
    EXPECT_EQ(e.stats().programs.load(), 4);
    e.stop();
}

TEST(SchedulerModel, ShortAnswersDoNotJoinTwoConversationsWithOneSystemPrompt) {
    // Each call's answer is shorter than the chain match's slack: only the previous call's
    // prompt, repeated whole, ties a request to it.
    auto m = tiny_model();
    Engine e(m, chat_config(2), nullptr);
    ASSERT_EQ(e.start(), "");
    const Tokens system = prompt_for(0, 64);
    auto call = [&](const Tokens & prompt) {
        auto r = greedy_request(*m, prompt, 3);
        r->tenant = "t";
        run_to_end(e, std::move(r));
    };
    const Tokens a = armada::testing::concat(system, prompt_for(1, 8));
    const Tokens b = armada::testing::concat(system, prompt_for(2, 8));
    call(a);
    call(b);
    EXPECT_EQ(e.stats().programs.load(), 2);
    call(armada::testing::concat(a, prompt_for(3, 8)));  // A's next call
    EXPECT_EQ(e.stats().programs.load(), 2);
    e.stop();
}

TEST(SchedulerModel, PromptChunksGoInThePolicysOrderNotAdmissionOrder) {
    // One chunk a step: a long prompt of a program with service (heavy) is admitted first; a short
    // one of a new program (light) arrives while heavy's is being computed. Under PLAS light's
    // chunks go first and it answers first; in admission order heavy's would finish first.
    auto run = [](SchedPolicy policy) {
        auto m = tiny_model();
        EngineConfig cfg;
        cfg.n_seq_max = 2;
        cfg.n_ctx = 2 * 2048;
        cfg.n_threads = 2;
        cfg.chunk = 32;
        cfg.n_batch = 34;  // one chunk and the generating tokens
        cfg.n_ubatch = 34;
        cfg.prefix_cache = false;
        cfg.sched = policy;
        Engine e(m, cfg, nullptr);
        EXPECT_EQ(e.start(), "");
        run_to_end(e, program_request(*m, 1, 200, "heavy"));  // heavy's service
        std::mutex mu;
        std::condition_variable cv;
        std::vector<std::string> order;
        auto sink_for = [&](std::string name) {
            return [&, name](GenEvent && ev) {
                if (ev.kind != GenEvent::Kind::Done) return;
                std::lock_guard lk(mu);
                order.push_back(name);
                cv.notify_all();
            };
        };
        auto heavy = greedy_request(*m, prompt_for(2, 1500), 1);
        heavy->program = "heavy";
        heavy->tenant = "t";
        heavy->sink = sink_for("heavy");
        EXPECT_EQ(e.submit(std::move(heavy)), SubmitStatus::Accepted);
        // Admitted once it counts as active; its 47 chunks take many steps.
        for (int k = 0; k < 1000 && e.stats().active.load() == 0; ++k)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        // At the 2 tokens a step a second prompt gets, light's 200 would take 100 steps.
        auto light = greedy_request(*m, prompt_for(3, 200), 1);
        light->program = "light";
        light->tenant = "t";
        light->sink = sink_for("light");
        EXPECT_EQ(e.submit(std::move(light)), SubmitStatus::Accepted);
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return order.size() == 2; });
        lk.unlock();
        e.stop();
        return order;
    };
    EXPECT_EQ(run(SchedPolicy::Plas), (std::vector<std::string>{"light", "heavy"}));
    EXPECT_EQ(run(SchedPolicy::Fcfs), (std::vector<std::string>{"heavy", "light"}));
}

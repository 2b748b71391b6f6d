// Engine tests on the real tiny model (label: model).
#include "engine/engine.h"
#include "engine/engine_set.h"
#include "engine/grammar_fast.h"
#include "model/greedy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <thread>

using namespace armada::engine;

namespace {

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

std::shared_ptr<Model> tiny_model() {
    static std::shared_ptr<Model> m = [] {
        llama_log_set(quiet_log, nullptr);
        const char * dir = std::getenv("ARMADA_MODEL_DIR");
        const std::string path = std::string(dir ? dir : "") + "/armada-tiny-q8_0.gguf";
        std::string err;
        auto mm = Model::load(path, nullptr, err);
        if (!mm) ADD_FAILURE() << err;
        return mm;
    }();
    return m;
}

//! Collects one request's events; wait() blocks until Done.
struct Collector {
    std::mutex mu;
    std::condition_variable cv;
    std::string text;
    std::vector<std::string> pieces;
    bool done = false;
    GenEvent final;

    GenSink sink() {
        return [this](GenEvent && ev) {
            std::lock_guard lk(mu);
            if (ev.kind == GenEvent::Kind::Text) {
                text += ev.text;
                pieces.push_back(ev.text);
                return;
            }
            final = ev;
            done = true;
            cv.notify_all();
        };
    }
    void wait() {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return done; });
    }
};

std::unique_ptr<GenRequest> greedy(const Model & m, Tokens prompt, int max_tokens, Collector & c) {
    auto r = armada::testing::greedy_request(m, std::move(prompt), max_tokens);
    r->sink = c.sink();
    return r;
}

Tokens prompt_for(int i, int len) {
    Tokens p;
    for (int k = 0; k < len; ++k)
        p.push_back(llama_token(500 + (i * 97 + k * 13) % 30000));
    return p;
}

}  // namespace

constexpr int kBatchedSeqs = 64;

TEST(EngineModel, GreedyAloneEqualsBatchedWithManyOthers) {
    auto m = tiny_model();
    ASSERT_TRUE(m);
    EngineConfig cfg;
    cfg.n_seq_max = kBatchedSeqs;
    cfg.n_ctx = kBatchedSeqs * 256;
    cfg.chunk = 64;
    cfg.n_threads = 2;

    std::string alone;
    {
        Engine e(m, cfg, nullptr);
        ASSERT_EQ(e.start(), "");
        Collector c;
        ASSERT_EQ(e.submit(greedy(*m, prompt_for(0, 40), 48, c)), SubmitStatus::Accepted);
        c.wait();
        EXPECT_EQ(c.final.n_generated, 48);
        alone = c.text;
    }
    Engine e(m, cfg, nullptr);
    ASSERT_EQ(e.start(), "");
    std::vector<std::unique_ptr<Collector>> cs;
    const int subject = kBatchedSeqs / 2 - 1;
    for (int i = 0; i < kBatchedSeqs; ++i) {
        cs.push_back(std::make_unique<Collector>());
        // The subject goes in the middle, with prompts of different lengths around it.
        auto req = i == subject ? greedy(*m, prompt_for(0, 40), 48, *cs.back())
                                : greedy(*m, prompt_for(i + 1, 10 + i * 3), 30 + i % 20, *cs.back());
        ASSERT_EQ(e.submit(std::move(req)), SubmitStatus::Accepted);
    }
    for (auto & c : cs)
        c->wait();
    EXPECT_EQ(cs[subject]->text, alone);
    EXPECT_FALSE(alone.empty());
}

TEST(EngineModel, CancellingOneLeavesOthersUntouched) {
    auto m = tiny_model();
    ASSERT_TRUE(m);
    EngineConfig cfg;
    cfg.n_seq_max = 4;
    cfg.n_ctx = 4 * 256;
    cfg.n_threads = 2;
    Engine ref(m, cfg, nullptr);
    ASSERT_EQ(ref.start(), "");
    std::vector<std::string> expect;
    for (int i = 0; i < 3; ++i) {
        Collector c;
        ref.submit(greedy(*m, prompt_for(i, 20), 40, c));
        c.wait();
        expect.push_back(c.text);
    }
    ref.stop();

    Engine e(m, cfg, nullptr);
    ASSERT_EQ(e.start(), "");
    Collector a, b, victim, d;
    auto rv = greedy(*m, prompt_for(9, 20), 200, victim);
    auto flag = rv->cancelled;
    e.submit(greedy(*m, prompt_for(0, 20), 40, a));
    e.submit(std::move(rv));
    e.submit(greedy(*m, prompt_for(1, 20), 40, b));
    e.submit(greedy(*m, prompt_for(2, 20), 40, d));
    // Cancel as soon as the victim has produced something.
    for (int spin = 0; spin < 2000; ++spin) {
        {
            std::lock_guard lk(victim.mu);
            if (!victim.pieces.empty() || victim.done) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    flag->store(true);
    e.wake();
    victim.wait();
    a.wait();
    b.wait();
    d.wait();
    EXPECT_EQ(victim.final.finish, FinishReason::Cancelled);
    EXPECT_LT(victim.final.n_generated, 200);
    EXPECT_EQ(a.text, expect[0]);
    EXPECT_EQ(b.text, expect[1]);
    EXPECT_EQ(d.text, expect[2]);
}

TEST(EngineModel, FollowUpTurnReusesKv) {
    auto m = tiny_model();
    ASSERT_TRUE(m);
    EngineConfig cfg;
    cfg.n_seq_max = 2;
    cfg.n_ctx = 2 * 512;
    cfg.n_threads = 2;
    Engine e(m, cfg, nullptr);
    ASSERT_EQ(e.start(), "");
    Collector first;
    Tokens p = prompt_for(3, 100);
    e.submit(greedy(*m, p, 10, first));
    first.wait();
    EXPECT_EQ(first.final.n_cached, 0);
    // The next turn repeats the conversation so far plus new tokens.
    Tokens p2 = p;
    for (int k = 0; k < 20; ++k)
        p2.push_back(llama_token(700 + k));
    Collector second;
    e.submit(greedy(*m, p2, 10, second));
    second.wait();
    EXPECT_EQ(second.final.n_cached, 100);
    EXPECT_EQ(second.final.n_prompt, 120);
}

TEST(EngineModel, QueueBeyondCapacityRefuses) {
    auto m = tiny_model();
    ASSERT_TRUE(m);
    EngineConfig cfg;
    cfg.n_seq_max = 1;
    cfg.n_ctx = 512;
    cfg.queue_max = 2;
    cfg.n_threads = 2;
    Engine e(m, cfg, nullptr);
    ASSERT_EQ(e.start(), "");
    std::vector<std::unique_ptr<Collector>> cs;
    int accepted = 0, refused = 0;
    for (int i = 0; i < 10; ++i) {
        cs.push_back(std::make_unique<Collector>());
        auto st = e.submit(greedy(*m, prompt_for(i, 10), 200, *cs.back()));
        if (st == SubmitStatus::Accepted) ++accepted;
        if (st == SubmitStatus::QueueFull) {
            ++refused;
            cs.back()->done = true;
        }
    }
    EXPECT_GE(refused, 1);
    EXPECT_LE(accepted, 3);
    for (auto & c : cs)
        c->wait();
}

TEST(EngineModel, StopStringEndsGeneration) {
    auto m = tiny_model();
    ASSERT_TRUE(m);
    EngineConfig cfg;
    cfg.n_seq_max = 1;
    cfg.n_ctx = 512;
    cfg.n_threads = 2;
    Engine e(m, cfg, nullptr);
    ASSERT_EQ(e.start(), "");
    Collector ref;
    e.submit(greedy(*m, prompt_for(5, 10), 30, ref));
    ref.wait();
    ASSERT_GE(ref.text.size(), 4u);
    // Stop at a string taken from the middle of the reference output.
    const std::string stop = ref.text.substr(ref.text.size() / 2, 2);
    Collector c;
    auto r = greedy(*m, prompt_for(5, 10), 30, c);
    r->stop = {stop};
    e.submit(std::move(r));
    c.wait();
    EXPECT_EQ(c.final.finish, FinishReason::Stop);
    EXPECT_EQ(c.text, ref.text.substr(0, ref.text.find(stop)));
}

namespace {
const char * kCallGrammar =
    R"(root ::= "<tool_call>\n{\"name\": \"" ("lookup" | "fetch") "\", \"arguments\": {\"page\": " [1-9] "}}\n</tool_call>"
)";

std::unique_ptr<GenRequest> call_request(const Model & m, int i, int max_tokens, Collector & c) {
    auto r = std::make_unique<GenRequest>();
    r->prompt = prompt_for(i, 12 + i);
    FastSamplerParams p;
    p.temperature = 0.8f;
    p.seed = uint32_t(100 + i);
    r->gfast = std::make_unique<GrammarFast>(m, kCallGrammar, "", p);
    r->max_tokens = max_tokens;
    r->render_special = true;
    r->sink = c.sink();
    return r;
}
}  // namespace

// Jump-forward on a tool-call grammar: every call is complete and valid, most of its tokens are
// fed without sampling, and when the batch has no room for all of them (8 sequences, a batch of
// 12) the rest go in the following steps. The same calls with jump-forward off sample every
// token. A max_tokens inside the forced text cuts the call there.
TEST(EngineModel, JumpForwardFeedsWhatTheGrammarForces) {
    auto m = tiny_model();
    ASSERT_TRUE(m);
    const std::regex valid(
        R"re(<tool_call>\n\{"name": "(lookup|fetch)", "arguments": \{"page": [1-9]\}\}\n</tool_call>)re");
    for (const bool jump : {true, false}) {
        EngineConfig cfg;
        cfg.n_seq_max = 8;
        cfg.n_ctx = 8 * 128;
        cfg.n_batch = 8;
        cfg.chunk = 4;  // the batch holds 12 tokens
        cfg.n_threads = 2;
        cfg.jump_forward = jump;
        Engine e(m, cfg, nullptr);
        ASSERT_EQ(e.start(), "");
        std::vector<std::unique_ptr<Collector>> cs;
        for (int i = 0; i < 8; ++i) {
            cs.push_back(std::make_unique<Collector>());
            ASSERT_EQ(e.submit(call_request(*m, i, 200, *cs.back())), SubmitStatus::Accepted);
        }
        int64_t generated = 0;
        for (auto & c : cs) {
            c->wait();
            EXPECT_EQ(c->final.finish, FinishReason::Stop) << c->final.error;
            EXPECT_TRUE(std::regex_match(c->text, valid)) << c->text;
            generated += c->final.n_generated;
        }
        if (jump) {
            EXPECT_GT(e.stats().forced_tokens.load(), uint64_t(generated / 2)) << "of " << generated;
        } else {
            EXPECT_EQ(e.stats().forced_tokens.load(), 0u);
        }
        Collector cut;
        ASSERT_EQ(e.submit(call_request(*m, 9, 3, cut)), SubmitStatus::Accepted);
        cut.wait();
        EXPECT_EQ(cut.final.finish, FinishReason::Length);
        EXPECT_EQ(cut.final.n_generated, 3);
        // Three tokens of the call, whatever their split: the start of its fixed head.
        const std::string head = "<tool_call>\n{\"name\": \"";
        const size_t n = std::min(head.size(), cut.text.size());
        EXPECT_FALSE(cut.text.empty());
        EXPECT_EQ(cut.text.substr(0, n), head.substr(0, n)) << cut.text;
    }
}

//! Two started engines of 2 sequences × 256 tokens each, one compute thread each.
std::vector<std::unique_ptr<Engine>> two_small_engines(const std::shared_ptr<Model> & m) {
    std::vector<std::unique_ptr<Engine>> engines;
    for (int i = 0; i < 2; ++i) {
        EngineConfig cfg;
        cfg.n_seq_max = 2;
        cfg.n_ctx = 2 * 256;
        cfg.n_threads = 1;
        cfg.index = i;
        cfg.kv_budget = 64ull << 20;
        engines.push_back(std::make_unique<Engine>(m, cfg, nullptr));
        EXPECT_EQ(engines.back()->start(), "");
    }
    return engines;
}

TEST(EngineSetModel, SessionsStayOnTheEngineHoldingTheirKvOthersGoWhereThereIsRoom) {
    auto m = tiny_model();
    ASSERT_TRUE(m);
    EngineSet set(two_small_engines(m));
    ASSERT_EQ(set.size(), 2u);
    auto run = [&](const std::string & session, int first_token) {
        Collector c;
        auto r = greedy(*m, prompt_for(first_token, 24), 8, c);
        r->session = session;
        EXPECT_EQ(set.submit(std::move(r)), SubmitStatus::Accepted);
        c.wait();
        return c.final;
    };
    run("a", 1);
    auto a = set.kv_usage("a");
    ASSERT_TRUE(a);
    // Both engines are idle; the other one has more free KV, so the next session goes there.
    run("b", 2);
    auto b = set.kv_usage("b");
    ASSERT_TRUE(b);
    EXPECT_NE(a->engine, b->engine);
    // Each session comes back to the engine that holds it and finds its KV there.
    for (int i = 0; i < 3; ++i) {
        const auto ev = run(i % 2 ? "b" : "a", i % 2 ? 2 : 1);
        EXPECT_EQ(ev.kv_source, "slot") << i;
        EXPECT_GT(ev.n_cached, 0) << i;
    }
    EXPECT_EQ(set.kv_usage("a")->engine, a->engine);
    EXPECT_EQ(set.kv_usage("b")->engine, b->engine);
    EXPECT_EQ(set.at(size_t(a->engine)).stats().requests.load(), 3u);
    EXPECT_EQ(set.at(size_t(b->engine)).stats().requests.load(), 2u);
    // Dropped sessions are forgotten everywhere.
    set.release("a", true);
    set.release("b", true);
    for (int i = 0; i < 200 && (set.kv_usage("a") || set.kv_usage("b")); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(set.kv_usage("a"));
    EXPECT_FALSE(set.kv_usage("b"));
    EXPECT_TRUE(set.has_room(4));
    EXPECT_FALSE(set.has_room(4 + 2 * 256 + 1));
    set.stop();
}

TEST(EngineSetModel, AChatFollowUpGoesToTheEngineWhoseCacheHoldsItsPrefix) {
    auto m = tiny_model();
    ASSERT_TRUE(m);
    EngineSet set(two_small_engines(m));
    ASSERT_EQ(set.size(), 2u);
    auto run = [&](const Tokens & prompt) {
        Collector c;
        auto r = greedy(*m, prompt, 8, c);
        r->tenant = "t";
        EXPECT_EQ(set.submit(std::move(r)), SubmitStatus::Accepted);
        c.wait();
        return c.final;
    };
    const Tokens first = prompt_for(5, 150);
    run(first);
    // The idle engine saves the finished request to its prompt cache.
    int holder = -1;
    for (int i = 0; i < 500 && holder < 0; ++i) {
        for (size_t k = 0; k < set.size(); ++k) {
            if (set.at(k).prefix_cache()->entries() > 0) holder = int(k);
        }
        if (holder < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GE(holder, 0);
    // By load alone the follow-up would go to the other engine (more free KV); it goes to the
    // one holding its prefix, and reuses it.
    const auto ev = run(armada::testing::concat(first, prompt_for(9, 20)));
    EXPECT_EQ(set.at(size_t(holder)).stats().requests.load(), 2u);
    EXPECT_GE(ev.n_cached, 150);
    // Another tenant's request is routed by load, and reuses nothing.
    Collector c;
    auto r = greedy(*m, armada::testing::concat(first, prompt_for(9, 20)), 8, c);
    r->tenant = "u";
    ASSERT_EQ(set.submit(std::move(r)), SubmitStatus::Accepted);
    c.wait();
    EXPECT_EQ(c.final.n_cached, 0);
}

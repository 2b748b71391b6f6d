// Session memory on the real tiny model (label: model): parking to RAM and disk, restore after a
// restart, the fingerprint fallback, and shared prefixes. Every check compares greedy output with
// a run that computed the whole prompt from scratch.
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "model/greedy.h"
#include "model/tiny_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

using namespace armada::engine;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<Model> tiny() {
    return armada::testing::tiny_model();
}

using Result = armada::testing::GreedyResult;
using armada::testing::concat;

//! Runs one greedy request to the end and returns its text and final event.
Result run(Engine & e, const Tokens & prompt, const std::string & session = {}, const std::string & tenant = {},
           int32_t prefix_len = 0, int max_tokens = 24) {
    auto r = armada::testing::greedy_request(e.model(), prompt, max_tokens);
    r->session = session;
    r->tenant = tenant;
    r->prefix_len = prefix_len;
    return armada::testing::run_to_end(e, std::move(r));
}

Tokens tokens(int seed, int len) {
    Tokens p;
    for (int k = 0; k < len; ++k)
        p.push_back(llama_token(300 + (seed * 131 + k * 17) % 20000));
    return p;
}

EngineConfig config(int n_seq, const std::string & dir = {}) {
    EngineConfig c;
    c.n_seq_max = n_seq;
    c.n_ctx = 1024 * n_seq;
    c.n_threads = 2;
    c.chunk = 128;
    c.kv_dir = dir;
    c.kv_budget = 256ull << 20;
    c.park_grace_ms = 60000;  // tests park by eviction, at known moments
    return c;
}

//! What the second turn produces when the session keeps its sequence between turns (no
//! parking): the same prompt splits as the parked run, so the tokens must match exactly.
//! (Computing the whole second prompt in other chunks may round differently in ggml's kernels.)
std::string reference(const Tokens & first, const Tokens & second) {
    EngineConfig c = config(1);
    c.park = false;
    Engine e(tiny(), c, nullptr);
    EXPECT_EQ(e.start(), "");
    run(e, first, "ref");
    const Result r = run(e, second, "ref");
    EXPECT_EQ(r.done.kv_source, "slot");
    return r.text;
}

//! The whole prompt computed from scratch, as after a failed or refused restore.
std::string scratch(const Tokens & prompt) {
    EngineConfig c = config(1);
    c.park = false;
    Engine e(tiny(), c, nullptr);
    EXPECT_EQ(e.start(), "");
    return run(e, prompt).text;
}

//! A session that computes the shared prefix itself (its key is not in the pool yet).
std::string computed_prefix(const Tokens & prompt, int32_t prefix_len) {
    Engine e(tiny(), config(1), nullptr);
    EXPECT_EQ(e.start(), "");
    const Result r = run(e, prompt, "ref", "ref", prefix_len);
    EXPECT_EQ(r.done.n_cached, 0);
    return r.text;
}

//! The journal gets a step's KV just after the step's answer is out: wait for it.
void wait_journaled(const Engine & e, uint64_t saves) {
    for (int i = 0; i < 500 && e.stats().journal_saves.load() < saves; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(e.stats().journal_saves.load(), saves);
    e.journal()->flush();
}

struct TempDir {
    fs::path path;
    TempDir() {
        path =
            fs::temp_directory_path() / ("armada-kv-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST(KvParking, RestoreFromRamIsTokenIdentical) {
    ASSERT_TRUE(tiny());
    const Tokens first = tokens(1, 300), second = concat(first, tokens(2, 40));
    const std::string want = reference(first, second);

    Engine e(tiny(), config(1), nullptr);
    ASSERT_EQ(e.start(), "");
    run(e, first, "sess_a");
    // Another session takes the only sequence: sess_a's KV must be parked, not lost.
    run(e, tokens(9, 50), "sess_b");
    EXPECT_EQ(e.stats().parks.load(), 1u);
    ASSERT_TRUE(e.kv_usage("sess_a"));
    EXPECT_EQ(e.kv_usage("sess_a")->where, "ram");
    EXPECT_EQ(e.kv_usage("sess_b")->where, "slot");

    const Result r = run(e, second, "sess_a");
    EXPECT_EQ(r.done.kv_source, "ram");
    EXPECT_EQ(r.done.n_cached, int32_t(first.size()));
    EXPECT_EQ(e.stats().restores_ram.load(), 1u);
    EXPECT_EQ(r.text, want);
}

//! A KV budget just above the context's own KV: any parked sequence goes straight to disk.
uint64_t tight_budget(const EngineConfig & c) {
    Engine probe(tiny(), c, nullptr);
    EXPECT_EQ(probe.start(), "");
    const uint64_t ctx_kv = probe.kv_bytes_per_cell() * uint64_t(c.n_ctx);
    return ctx_kv * 10 / 9 + 4096;
}

TEST(KvParking, SpillToDiskAndRestoreIsTokenIdentical) {
    ASSERT_TRUE(tiny());
    TempDir dir;
    const Tokens first = tokens(3, 400), second = concat(first, tokens(4, 30));
    const std::string want = reference(first, second);

    EngineConfig c = config(1, dir.path.string());
    c.kv_budget = tight_budget(c);
    c.kv_journal = false;  // the pool's own spill files (the journal case is below)
    Engine e(tiny(), c, nullptr);
    ASSERT_EQ(e.start(), "");
    run(e, first, "sess_a");
    run(e, tokens(8, 60), "sess_b");
    ASSERT_TRUE(e.kv_usage("sess_a"));
    EXPECT_EQ(e.kv_usage("sess_a")->where, "disk");
    EXPECT_EQ(e.pool().stats().spilled, 1u);
    EXPECT_EQ(e.pool().stats().ram_bytes, 0u);
    EXPECT_FALSE(e.kv_pressure());  // spilling worked: nothing had to be dropped

    const Result r = run(e, second, "sess_a");
    EXPECT_EQ(r.done.kv_source, "disk");
    EXPECT_EQ(r.done.n_cached, int32_t(first.size()));
    EXPECT_EQ(r.text, want);
}

TEST(KvParking, SpillOfAJournaledSessionOnlyFreesRam) {
    ASSERT_TRUE(tiny());
    TempDir dir;
    const Tokens first = tokens(3, 400), second = concat(first, tokens(4, 30));
    const std::string want = reference(first, second);

    EngineConfig c = config(1, dir.path.string());
    c.kv_budget = tight_budget(c);
    Engine e(tiny(), c, nullptr);
    ASSERT_EQ(e.start(), "");
    run(e, first, "sess_a");
    wait_journaled(e, 1);
    run(e, tokens(8, 60), "sess_b");
    ASSERT_TRUE(e.kv_usage("sess_a"));
    EXPECT_EQ(e.kv_usage("sess_a")->where, "disk");
    EXPECT_EQ(e.pool().stats().spilled, 0u);  // nothing written on the engine thread
    EXPECT_EQ(e.pool().stats().released, 1u);
    EXPECT_EQ(e.pool().stats().disk_entries, 0u);

    const Result r = run(e, second, "sess_a");
    EXPECT_EQ(r.done.kv_source, "journal");
    EXPECT_EQ(r.done.n_cached, int32_t(first.size()));
    EXPECT_EQ(r.text, want);
}

TEST(KvParking, RestartRestoresFromDiskAndForeignFingerprintReprefills) {
    ASSERT_TRUE(tiny());
    TempDir dir;
    const Tokens first = tokens(5, 350), second = concat(first, tokens(6, 25));
    const std::string want = reference(first, second);
    // The pool's own files written at a clean stop (journals are covered by KvJournal.*).
    auto pool_only = [](const TempDir & d) {
        EngineConfig c = config(1, d.path.string());
        c.kv_journal = false;
        return c;
    };
    {
        Engine e(tiny(), pool_only(dir), nullptr);
        ASSERT_EQ(e.start(), "");
        run(e, first, "sess_a");
        run(e, first, "sess_c");  // parks sess_a
        e.stop();                 // clean stop: what is parked or held goes to disk
    }
    {
        // Same model, build and settings: the new process finds the file and restores it.
        Engine e(tiny(), pool_only(dir), nullptr);
        ASSERT_EQ(e.start(), "");
        ASSERT_TRUE(e.kv_usage("sess_a"));
        EXPECT_EQ(e.kv_usage("sess_a")->where, "disk");
        const Result r = run(e, second, "sess_a");
        EXPECT_EQ(r.done.kv_source, "disk");
        EXPECT_EQ(r.done.n_cached, int32_t(first.size()));
        EXPECT_EQ(r.text, want);
        EXPECT_EQ(e.stats().restore_failures.load(), 0u);
    }
    {
        // A different fingerprint (as after a model or llama.cpp change): never loaded, the
        // session re-prefills and still gets the same tokens.
        EngineConfig c = pool_only(dir);
        c.fingerprint_extra = "changed";
        Engine e(tiny(), c, nullptr);
        ASSERT_EQ(e.start(), "");
        const Result r = run(e, concat(first, tokens(6, 25)), "sess_c");
        EXPECT_EQ(r.done.kv_source, "");
        EXPECT_EQ(r.done.n_cached, 0);
        EXPECT_EQ(e.stats().restore_failures.load(), 1u);
        EXPECT_EQ(r.text, scratch(concat(first, tokens(6, 25))));
    }
}

TEST(KvParking, SharedPrefixGivesTheSameTokens) {
    ASSERT_TRUE(tiny());
    const Tokens prefix = tokens(7, 200);
    const Tokens a = concat(prefix, tokens(10, 30)), b = concat(prefix, tokens(11, 35));
    const std::string want_a = computed_prefix(a, int32_t(prefix.size())),
                      want_b = computed_prefix(b, int32_t(prefix.size()));

    Engine e(tiny(), config(2), nullptr);
    ASSERT_EQ(e.start(), "");
    const Result ra = run(e, a, "sess_1", "tenant1", int32_t(prefix.size()));
    EXPECT_EQ(e.stats().prefix_saves.load(), 1u);
    EXPECT_EQ(ra.done.n_cached, 0);
    EXPECT_EQ(ra.text, want_a);
    const Result rb = run(e, b, "sess_2", "tenant1", int32_t(prefix.size()));
    EXPECT_EQ(rb.done.kv_source, "prefix");
    EXPECT_EQ(rb.done.n_cached, int32_t(prefix.size()));
    EXPECT_EQ(e.stats().prefix_hits.load(), 1u);
    EXPECT_EQ(rb.text, want_b);
    // Another tenant does not see it, nor the sequences holding it.
    const Result rc = run(e, b, "sess_3", "tenant2", int32_t(prefix.size()));
    EXPECT_EQ(rc.done.kv_source, "");
    EXPECT_EQ(rc.done.n_cached, 0);
    EXPECT_EQ(rc.text, want_b);
}

TEST(KvParking, MoreSessionsThanSequences) {
    ASSERT_TRUE(tiny());
    Engine e(tiny(), config(2), nullptr);
    ASSERT_EQ(e.start(), "");
    const int n = 8;
    std::vector<Tokens> ctx(n);
    for (int i = 0; i < n; ++i) {
        ctx[size_t(i)] = tokens(20 + i, 120);
        run(e, ctx[size_t(i)], "s" + std::to_string(i), {}, 0, 4);
    }
    // Each session comes back; six of eight were parked, all continue from their KV.
    for (int i = 0; i < n; ++i) {
        const Tokens next = concat(ctx[size_t(i)], tokens(40 + i, 10));
        const Result r = run(e, next, "s" + std::to_string(i), {}, 0, 4);
        EXPECT_GE(r.done.n_cached, int32_t(ctx[size_t(i)].size())) << i;
    }
    EXPECT_GE(e.stats().restores_ram.load(), 6u);
    // Released sessions are gone everywhere.
    for (int i = 0; i < n; ++i)
        e.release("s" + std::to_string(i), true);
    run(e, tokens(99, 10));  // the release ops run before this request
    for (int i = 0; i < n; ++i)
        EXPECT_FALSE(e.kv_usage("s" + std::to_string(i))) << i;
}

TEST(KvParking, ABurstOfNewSessionsComputesTheSharedPrefixOnce) {
    ASSERT_TRUE(tiny());
    const Tokens prefix = tokens(70, 300);
    Engine e(tiny(), config(4), nullptr);
    ASSERT_EQ(e.start(), "");
    // Four new sessions of one agent arrive together: one computes the prefix, three wait for it
    // and start from it.
    std::vector<std::thread> ts;
    std::vector<Result> rs(4);
    for (int i = 0; i < 4; ++i) {
        ts.emplace_back([&, i] {
            rs[size_t(i)] = run(e, concat(prefix, tokens(80 + i, 20)), "burst" + std::to_string(i), "tenant",
                                int32_t(prefix.size()), 4);
        });
    }
    for (auto & t : ts)
        t.join();
    EXPECT_EQ(e.stats().prefix_saves.load(), 1u);
    EXPECT_EQ(e.stats().prefix_hits.load(), 3u);
    int from_prefix = 0;
    for (const auto & r : rs)
        from_prefix += r.done.kv_source == "prefix" ? 1 : 0;
    EXPECT_EQ(from_prefix, 3);
}

namespace {

//! Copies a directory tree, as a crash leaves it (taken while the engine still runs).
void copy_tree(const fs::path & from, const fs::path & to) {
    fs::create_directories(to);
    fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
}

}  // namespace

TEST(KvJournal, StepsAreAppendedAndACrashedSessionResumesFromTheJournal) {
    ASSERT_TRUE(tiny());
    TempDir dir, crashed;
    const Tokens p1 = tokens(11, 200);
    const Tokens p2 = concat(p1, tokens(12, 60));
    const Tokens p3 = concat(p2, tokens(13, 40));
    const Tokens p4 = concat(p3, tokens(14, 30));

    // Reference: the session keeps its sequence for all four steps.
    std::string want;
    {
        EngineConfig c = config(1);
        c.park = false;
        Engine e(tiny(), c, nullptr);
        ASSERT_EQ(e.start(), "");
        run(e, p1, "ref");
        run(e, p2, "ref");
        run(e, p3, "ref");
        want = run(e, p4, "ref").text;
    }

    EngineConfig c = config(1, dir.path.string());
    Engine e(tiny(), c, nullptr);
    ASSERT_EQ(e.start(), "");
    ASSERT_NE(e.journal(), nullptr);
    run(e, p1, "sess_j");
    run(e, p2, "sess_j");
    run(e, p3, "sess_j");
    wait_journaled(e, 3);
    const auto js = e.journal()->stats();
    EXPECT_EQ(js.records, 3u);
    EXPECT_EQ(js.bases, 1u);  // the later steps appended only what was new

    // What the journal folds to is exactly the sequence's state, and cutting and joining it by
    // position gives back the same bytes.
    std::string why;
    auto blob = e.journal()->load("sess_j", why);
    ASSERT_TRUE(blob) << why;
    EXPECT_EQ(blob->tokens.size(), p3.size() + 24 - 1);  // the last sampled token is never decoded
    auto layout = SeqState::parse(blob->data.data(), blob->data.size(), why);
    ASSERT_TRUE(layout) << why;
    EXPECT_EQ(layout->cell_count(), blob->tokens.size());
    const int32_t cut = 123;
    auto a = layout->select(blob->data.data(), 0, cut);
    auto b = layout->select(blob->data.data(), cut, 1 << 30);
    auto la = SeqState::parse(a.data(), a.size(), why), lb = SeqState::parse(b.data(), b.size(), why);
    ASSERT_TRUE(la && lb) << why;
    EXPECT_EQ(la->cell_count(), uint32_t(cut));
    EXPECT_EQ(SeqState::join(a.data(), *la, b.data(), *lb), blob->data);

    // A crash now: the pool's RAM is gone, the journal on disk is what is left. A new engine (or
    // another node given these files) resumes the session from it, token-identical.
    copy_tree(dir.path, crashed.path);
    {
        Engine e2(tiny(), config(1, crashed.path.string()), nullptr);
        ASSERT_EQ(e2.start(), "");
        ASSERT_TRUE(e2.kv_usage("sess_j"));
        EXPECT_EQ(e2.kv_usage("sess_j")->where, "disk");
        EXPECT_EQ(e2.kv_usage("sess_j")->tokens, int64_t(blob->tokens.size()));
        const Result r = run(e2, p4, "sess_j");
        EXPECT_EQ(r.done.kv_source, "journal");
        EXPECT_EQ(r.done.n_cached, int32_t(p3.size()));
        EXPECT_EQ(r.text, want);
        EXPECT_EQ(e2.stats().restores_journal.load(), 1u);
        // The resumed session keeps appending to the same file.
        wait_journaled(e2, 1);
        EXPECT_EQ(e2.journal()->stats().bases, 0u);
        EXPECT_EQ(e2.journal()->stats().records, 1u);
    }
    // With another fingerprint the journal is not used: the session re-prefills.
    {
        copy_tree(dir.path, crashed.path);
        EngineConfig c3 = config(1, crashed.path.string());
        c3.fingerprint_extra = "other build";
        Engine e3(tiny(), c3, nullptr);
        ASSERT_EQ(e3.start(), "");
        const Result r = run(e3, p4, "sess_j");
        EXPECT_EQ(r.done.kv_source, "");
        EXPECT_EQ(r.done.n_cached, 0);
    }
    // A deleted session's journal goes with it.
    e.release("sess_j", true);
    run(e, tokens(15, 20), "other");
    e.journal()->flush();
    EXPECT_FALSE(e.journal()->contains("sess_j"));
}

// The KV size per token the node budgets and reports is the context's real one: its cache
// types and the model's KV heads (grouped-query attention) and head sizes. Checked against the
// size of a saved sequence, for f16 and a quantized cache.
TEST(KvSize, BytesPerTokenAgreeWithTheSavedStateWithinFivePercent) {
    ASSERT_TRUE(tiny());
    uint64_t f16 = 0;
    for (const auto & [k, v] : {std::pair{GGML_TYPE_F16, GGML_TYPE_F16}, std::pair{GGML_TYPE_Q8_0, GGML_TYPE_Q8_0},
                                std::pair{GGML_TYPE_Q8_0, GGML_TYPE_F16}}) {
        EngineConfig c = config(1);
        c.type_k = k;
        c.type_v = v;
        armada::obs::Registry metrics;
        Engine e(tiny(), c, &metrics);
        ASSERT_EQ(e.start(), "") << ggml_type_name(k) << "/" << ggml_type_name(v);
        run(e, tokens(1, 400), "sess_a", {}, 0, 1);
        run(e, tokens(9, 20), "sess_b", {}, 0, 1);  // takes the sequence: sess_a is saved to RAM
        const auto info = e.pool().info("sess_a");
        ASSERT_TRUE(info);
        const double measured = double(info->raw_bytes) / double(info->n_tokens);
        const double reported = double(e.kv_bytes_per_cell());
        EXPECT_NEAR(reported / measured, 1.0, 0.05)
            << ggml_type_name(k) << "/" << ggml_type_name(v) << ": reported " << reported << " bytes per token, "
            << "the saved state holds " << measured;
        // The capacity the node reports is that size times the context's cells.
        const double total = metrics.gauge("armada_kv_bytes_capacity", "").value();
        EXPECT_NEAR(total / (measured * c.n_ctx), 1.0, 0.05) << "armada_kv_bytes_capacity " << total;
        if (k == GGML_TYPE_F16 && v == GGML_TYPE_F16) f16 = e.kv_bytes_per_cell();
        if (k == GGML_TYPE_Q8_0 && v == GGML_TYPE_Q8_0) EXPECT_LT(e.kv_bytes_per_cell(), f16 * 6 / 10);
    }
}

// The prompt-prefix cache on the real tiny model (label: model): anonymous requests (chat and
// completions, no session) keep their KV by content and tenant, and a later request with the
// same prefix restores it. Greedy output is compared with a run that computed the whole prompt,
// split into the same chunks, so the tokens must match exactly.
#include "cli/mkmodel.h"
#include "engine/engine.h"
#include "model/greedy.h"
#include "model/tiny_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

using namespace armada::engine;
namespace fs = std::filesystem;

namespace {

using Result = armada::testing::GreedyResult;
using armada::testing::concat;

//! Runs one greedy anonymous request to the end.
Result run(Engine & e, const Tokens & prompt, const std::string & tenant, int max_tokens = 16) {
    auto r = armada::testing::greedy_request(e.model(), prompt, max_tokens);
    r->tenant = tenant;
    return armada::testing::run_to_end(e, std::move(r));
}

Tokens tokens(int seed, int len) {
    Tokens p;
    for (int k = 0; k < len; ++k)
        p.push_back(llama_token(300 + (seed * 131 + k * 17) % 20000));
    return p;
}

EngineConfig config(int n_seq, const std::string & dir = {}, int32_t n_ctx_seq = 1024) {
    EngineConfig c;
    c.n_seq_max = n_seq;
    c.n_ctx = n_ctx_seq * n_seq;
    c.n_threads = 2;
    c.chunk = 128;
    c.kv_dir = dir;
    c.kv_budget = 256ull << 20;
    c.park_grace_ms = 60000;
    return c;
}

//! A budget that leaves the pool almost no RAM: every entry spills to disk when saved.
uint64_t disk_only_budget(const EngineConfig & c) {
    const uint64_t ctx_kv = armada::testing::tiny_model()->kv_bytes_per_token(c.type_k, c.type_v) * uint64_t(c.n_ctx);
    return ctx_kv + ctx_kv / 8;
}

//! The whole prompt computed by an engine with no cache at all.
std::string scratch(const Tokens & prompt) {
    EngineConfig c = config(1);
    c.prefix_cache = false;
    c.park = false;
    Engine e(armada::testing::tiny_model(), c, nullptr);
    EXPECT_EQ(e.start(), "");
    const Result r = run(e, prompt, "t");
    EXPECT_EQ(r.done.n_cached, 0);
    return r.text;
}

// 256 tokens, two whole chunks: the restored run computes [256, n) in one chunk, exactly as the
// scratch run does after its first two.
const Tokens kFirst = tokens(5, 256);

std::string tmpdir(const std::string & name) {
    const auto d = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
    fs::remove_all(d);
    return d.string();
}

}  // namespace

TEST(PromptCache, RestoreFromRamIsTokenIdentical) {
    ASSERT_TRUE(armada::testing::tiny_model());
    const Tokens second = concat(kFirst, tokens(6, 40));
    const std::string want = scratch(second);

    Engine e(armada::testing::tiny_model(), config(1), nullptr);
    ASSERT_EQ(e.start(), "");
    // max_tokens 1: the answer's only token is sampled, never decoded, so the KV is the prompt.
    EXPECT_EQ(run(e, kFirst, "t", 1).done.kv_tokens, 256);
    // Another prompt takes the only sequence: the first one's KV is in the cache by then (saved
    // while the engine was idle, or when the sequence was wanted).
    run(e, tokens(9, 100), "t", 1);
    ASSERT_TRUE(e.prefix_cache()->contains(e.prefix_cache()->key_for("t", kFirst)));
    EXPECT_GE(e.pool().stats().cache_ram_entries, 1u);
    const Result r = run(e, second, "t");
    EXPECT_EQ(r.done.kv_source, "prefix");
    EXPECT_EQ(r.done.n_cached, 256);
    EXPECT_EQ(e.stats().restores_ram.load(), 1u);
    EXPECT_EQ(r.text, want);
    EXPECT_GE(e.prefix_cache()->tokens_saved.load(), 256u);
}

TEST(PromptCache, RestoreFromDiskIsTokenIdenticalAndSurvivesARestart) {
    ASSERT_TRUE(armada::testing::tiny_model());
    const Tokens second = concat(kFirst, tokens(6, 40));
    const std::string want = scratch(second);
    const std::string dir = tmpdir("armada-pcache-disk");
    EngineConfig c = config(1, dir);
    c.kv_budget = disk_only_budget(c);
    {
        Engine e(armada::testing::tiny_model(), c, nullptr);
        ASSERT_EQ(e.start(), "");
        run(e, kFirst, "t", 1);
        run(e, tokens(9, 100), "t", 1);
        ASSERT_TRUE(e.prefix_cache()->contains(e.prefix_cache()->key_for("t", kFirst)));
        const auto ps = e.pool().stats();
        EXPECT_GE(ps.cache_disk_entries, 1u);
        EXPECT_EQ(ps.cache_ram_entries, 0u);
        const Result r = run(e, second, "t");
        EXPECT_EQ(r.done.kv_source, "prefix");
        EXPECT_EQ(r.done.n_cached, 256);
        EXPECT_EQ(e.stats().restores_disk.load(), 1u);
        EXPECT_EQ(r.text, want);
    }
    // A restart finds the entries on disk and indexes them again. (Which ones depends on whether
    // the engine saved the second request before it stopped; both share kFirst with this one.)
    const Tokens third = concat(kFirst, tokens(8, 40));
    const std::string want3 = scratch(third);
    Engine e(armada::testing::tiny_model(), c, nullptr);
    ASSERT_EQ(e.start(), "");
    EXPECT_GE(e.prefix_cache()->entries(), 1u);
    const Result r = run(e, third, "t");
    EXPECT_EQ(r.done.kv_source, "prefix");
    EXPECT_EQ(r.done.n_cached, 256);
    EXPECT_EQ(r.text, want3);
    fs::remove_all(dir);
}

TEST(PromptCache, TenantsNeverShareAnEntryOrASequence) {
    ASSERT_TRUE(armada::testing::tiny_model());
    const Tokens second = concat(kFirst, tokens(6, 40));
    const Tokens longer = concat(second, tokens(7, 10));
    // One sequence: every request lands where the previous tenant's KV is.
    Engine e(armada::testing::tiny_model(), config(1), nullptr);
    ASSERT_EQ(e.start(), "");
    run(e, kFirst, "alice", 1);
    // The same prefix from another tenant, in the very sequence holding alice's KV: nothing reused.
    const Result b = run(e, second, "bob");
    EXPECT_EQ(b.done.n_cached, 0);
    EXPECT_EQ(b.done.kv_source, "");
    // alice gets hers back from her entry (bob's KV is in the sequence now).
    const Result a = run(e, longer, "alice", 1);
    EXPECT_EQ(a.done.kv_source, "prefix");
    EXPECT_EQ(a.done.n_cached, 256);
    run(e, tokens(30, 100), "carol", 1);
    // bob's own entry (second + his answer) shares all of `second` with this prompt; alice's
    // (`longer`) would share 10 tokens more. He gets exactly his own.
    const Result b2 = run(e, concat(longer, tokens(12, 5)), "bob");
    EXPECT_EQ(b2.done.kv_source, "prefix");
    EXPECT_EQ(b2.done.n_cached, int32_t(second.size()));
    const Result d = run(e, concat(longer, tokens(12, 5)), "dave");
    EXPECT_EQ(d.done.n_cached, 0);
}

TEST(PromptCache, AChangedContextSizeOrModelNeverRestoresAnOldEntry) {
    ASSERT_TRUE(armada::testing::tiny_model());
    const Tokens second = concat(kFirst, tokens(6, 40));
    const std::string dir = tmpdir("armada-pcache-fp");
    EngineConfig c = config(1, dir);
    c.kv_budget = disk_only_budget(c);
    {
        Engine e(armada::testing::tiny_model(), c, nullptr);
        ASSERT_EQ(e.start(), "");
        run(e, kFirst, "t", 1);
        run(e, tokens(9, 100), "t", 1);
        ASSERT_GE(e.pool().stats().cache_disk_entries, 1u);
    }
    // Another context size: the file is not indexed, and is deleted.
    EngineConfig other = config(1, dir, 2048);
    other.kv_budget = disk_only_budget(other);
    {
        Engine e(armada::testing::tiny_model(), other, nullptr);
        ASSERT_EQ(e.start(), "");
        EXPECT_EQ(e.prefix_cache()->entries(), 0u);
        EXPECT_EQ(e.pool().stats().cache_disk_entries, 0u);
        const Result r = run(e, second, "t");
        EXPECT_EQ(r.done.n_cached, 0);
    }
    // The fingerprint's extra part (the server's own settings): the same.
    {
        Engine e(armada::testing::tiny_model(), c, nullptr);
        ASSERT_EQ(e.start(), "");
        run(e, kFirst, "t", 1);
        run(e, tokens(9, 100), "t", 1);
        ASSERT_GE(e.pool().stats().cache_disk_entries, 1u);
    }
    EngineConfig changed = c;
    changed.fingerprint_extra = "another-setting";
    Engine e(armada::testing::tiny_model(), changed, nullptr);
    ASSERT_EQ(e.start(), "");
    EXPECT_EQ(e.prefix_cache()->entries(), 0u);
    EXPECT_EQ(run(e, second, "t").done.n_cached, 0);
    fs::remove_all(dir);
}

// A model file replaced by another of the same shape, type and size (new weights, as after a
// fine-tune is deployed under the same name): entries saved with the old weights are never
// restored. The same bytes at another path are, so the check is on content, not on the path.
TEST(PromptCache, AnotherModelFileOfTheSameShapeNeverRestoresAnOldEntry) {
    ASSERT_TRUE(armada::testing::tiny_model());
    const std::string dir = tmpdir("armada-pcache-file");
    const std::string files = tmpdir("armada-pcache-models");
    fs::create_directories(files);
    const std::string first = files + "/first.gguf";
    const std::string same = files + "/same.gguf";
    const std::string other = files + "/other.gguf";
    armada::cli::MkModelOptions mk;
    mk.shape = "tiny";
    mk.type = "q8_0";
    mk.output = first;
    ASSERT_EQ(armada::cli::write_model(mk), "");
    fs::copy_file(first, same);
    mk.output = other;
    mk.seed += 1;  // other weights, same shape, type and size
    ASSERT_EQ(armada::cli::write_model(mk), "");
    ASSERT_EQ(fs::file_size(other), fs::file_size(first));
    std::string err;
    auto first_model = Model::load(first, nullptr, err);
    ASSERT_TRUE(first_model) << err;
    auto same_model = Model::load(same, nullptr, err);
    ASSERT_TRUE(same_model) << err;
    auto other_model = Model::load(other, nullptr, err);
    ASSERT_TRUE(other_model) << err;

    EngineConfig c = config(1, dir);
    c.kv_budget = disk_only_budget(c);
    const auto save_first = [&] {
        Engine e(first_model, c, nullptr);
        ASSERT_EQ(e.start(), "");
        run(e, kFirst, "t", 1);
        run(e, tokens(9, 100), "t", 1);
        ASSERT_GE(e.pool().stats().cache_disk_entries, 1u);
    };
    const Tokens second = concat(kFirst, tokens(6, 40));
    ASSERT_NO_FATAL_FAILURE(save_first());
    {
        Engine e(same_model, c, nullptr);
        ASSERT_EQ(e.start(), "");
        EXPECT_GE(e.prefix_cache()->entries(), 1u);
        EXPECT_EQ(run(e, second, "t").done.n_cached, 256);
    }
    ASSERT_NO_FATAL_FAILURE(save_first());
    {
        Engine e(other_model, c, nullptr);
        ASSERT_EQ(e.start(), "");
        EXPECT_EQ(e.prefix_cache()->entries(), 0u);
        EXPECT_EQ(e.pool().stats().cache_disk_entries, 0u);
        const Result r = run(e, second, "t");
        EXPECT_EQ(r.done.n_cached, 0);
        EXPECT_NE(r.done.kv_source, "prefix");
    }
    fs::remove_all(dir);
    fs::remove_all(files);
}

TEST(PromptCache, ABurstWithOneNewPrefixComputesItOnce) {
    ASSERT_TRUE(armada::testing::tiny_model());
    const Tokens shared = tokens(70, 320);
    Engine e(armada::testing::tiny_model(), config(4), nullptr);
    ASSERT_EQ(e.start(), "");
    // Four requests arrive together with one system prompt nobody has computed: one computes it,
    // the others wait for it and copy its KV.
    std::vector<std::thread> ts;
    std::vector<Result> rs(4);
    for (int i = 0; i < 4; ++i)
        ts.emplace_back([&, i] { rs[size_t(i)] = run(e, concat(shared, tokens(80 + i, 20)), "t", 4); });
    for (auto & t : ts)
        t.join();
    int computed = 0, reused = 0;
    for (const auto & r : rs) {
        if (r.done.n_cached == 0) ++computed;
        if (r.done.n_cached >= int32_t(shared.size())) ++reused;
    }
    EXPECT_EQ(computed, 1);
    EXPECT_EQ(reused, 3);
    // The prompt tokens the engine evaluated: one shared prefix, four suffixes.
    EXPECT_EQ(e.prefix_cache()->tokens_saved.load(), 3 * shared.size());
}

TEST(PromptCache, OffMeansNoReuseAcrossSequences) {
    ASSERT_TRUE(armada::testing::tiny_model());
    EngineConfig c = config(1);
    c.prefix_cache = false;
    Engine e(armada::testing::tiny_model(), c, nullptr);
    ASSERT_EQ(e.start(), "");
    EXPECT_EQ(e.prefix_cache(), nullptr);
    run(e, kFirst, "t", 1);
    run(e, tokens(9, 100), "t", 1);
    EXPECT_EQ(run(e, concat(kFirst, tokens(6, 40)), "t").done.n_cached, 0);
}

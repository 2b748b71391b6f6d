// The fast grammar path must allow exactly what llama.cpp's grammar allows (label: model).
#include "engine/grammar_fast.h"
#include "model/tiny_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

using namespace armada::engine;

namespace {
std::shared_ptr<Model> tiny() {
    return armada::testing::tiny_model();
}

const char * kGrammar =
    R"(root ::= "<tool_call>\n" "{" space "\"name\"" space ":" space "\"lookup\"" space "," space "\"arguments\"" space ":" space args space "}" "\n</tool_call>"
args ::= "{" space "\"record\"" space ":" space ("\"alpha\"" | "\"beta\"" | "\"gamma\"") space "," space "\"n\"" space ":" space num space "}"
num ::= "-"? [0-9]{1,4}
space ::= | " "
)";
}  // namespace

// Greedy: the fast path must pick the best token among those the full grammar allows, at every
// step of a whole call, for many random logit vectors. A token the prefilter wrongly dropped
// would show up as a different argmax.
TEST(GrammarFast, GreedyPicksTheBestTokenTheFullGrammarAllows) {
    auto m = tiny();
    ASSERT_TRUE(m);
    const int32_t n = m->n_vocab();
    std::mt19937 rng(7);
    std::normal_distribution<float> noise(0.0f, 3.0f);
    for (int trial = 0; trial < 6; ++trial) {
        FastSamplerParams p;
        p.temperature = 0;
        GrammarFast fast(*m, kGrammar, "", p);
        llama_sampler * full = llama_sampler_init_grammar(m->vocab(), kGrammar, "root");
        ASSERT_NE(full, nullptr);
        std::vector<float> logits(static_cast<size_t>(n), 0.0f);
        std::vector<llama_token_data> cand(static_cast<size_t>(n));
        for (int step = 0; step < 80; ++step) {
            for (auto & l : logits)
                l = noise(rng);
            for (llama_token t = 0; t < n; ++t)
                cand[size_t(t)] = {t, logits[size_t(t)], 0.0f};
            llama_token_data_array arr{cand.data(), cand.size(), -1, false};
            llama_sampler_apply(full, &arr);
            llama_token best = LLAMA_TOKEN_NULL;
            for (const auto & c : cand) {
                if (c.logit != -INFINITY && (best == LLAMA_TOKEN_NULL || c.logit > cand[size_t(best)].logit))
                    best = c.id;
            }
            ASSERT_NE(best, LLAMA_TOKEN_NULL);
            const llama_token got = fast.sample(logits.data(), n);
            ASSERT_EQ(got, best) << "trial " << trial << " step " << step;
            if (m->is_eog(got)) break;
            ASSERT_TRUE(fast.accept(got));
            llama_sampler_accept(full, got);
        }
        llama_sampler_free(full);
    }
}

namespace {
const char * kOneLayout =
    R"(root ::= "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"record\": " ("\"alpha\"" | "\"beta\"") "}}\n</tool_call>"
)";

// Feeds text the way the engine does after a jump-forward: byte by byte, into another grammar.
bool accept_text(llama_sampler * g, const Model & m, const std::string & text) {
    const VocabIndex & ix = VocabIndex::of(m);
    for (char c : text) {
        const llama_token t = ix.byte_token[static_cast<uint8_t>(c)];
        if (t == LLAMA_TOKEN_NULL) return false;
        llama_token_data d{t, 0.0f, 0.0f};
        llama_token_data_array a{&d, 1, -1, false};
        llama_sampler_apply(g, &a);
        if (d.logit == -INFINITY) return false;
        llama_sampler_accept(g, t);
    }
    return true;
}
}  // namespace

// Jump-forward: the text the grammar allows one way comes out whole, stops at each choice and at
// a possible end, respects its byte limit, and is exactly what llama.cpp's own grammar accepts.
TEST(GrammarFast, ForcedTextIsWhatTheGrammarAllowsOneWay) {
    auto m = tiny();
    ASSERT_TRUE(m);
    FastSamplerParams p;
    p.temperature = 0;
    GrammarFast fast(*m, kOneLayout, "", p);
    llama_sampler * full = llama_sampler_init_grammar(m->vocab(), kOneLayout, "root");
    ASSERT_NE(full, nullptr);

    EXPECT_EQ(fast.forced(5), "<tool");  // the limit holds, and the rest is still forced
    std::string head = "<tool" + fast.forced(256);
    EXPECT_EQ(head, "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"record\": \"");
    EXPECT_EQ(fast.forced(256), "");  // "alpha" or "beta": a choice
    ASSERT_TRUE(accept_text(full, *m, head));

    const llama_token b = VocabIndex::of(*m).byte_token[static_cast<uint8_t>('b')];
    ASSERT_NE(b, LLAMA_TOKEN_NULL);
    ASSERT_TRUE(fast.accept(b));
    const std::string tail = fast.forced(256);
    EXPECT_EQ(tail, "eta\"}}\n</tool_call>");
    ASSERT_TRUE(accept_text(full, *m, "b" + tail));
    EXPECT_EQ(fast.forced(256), "");  // the output may end here: not forced

    // Both grammars now allow the end of generation.
    bool eog_fits = false;
    for (llama_token t = 0; t < m->n_vocab() && !eog_fits; ++t) {
        if (!m->is_eog(t)) continue;
        llama_token_data d{t, 0.0f, 0.0f};
        llama_token_data_array a{&d, 1, -1, false};
        llama_sampler_apply(full, &a);
        eog_fits = d.logit != -INFINITY;
    }
    EXPECT_TRUE(eog_fits);
    llama_sampler_free(full);
}

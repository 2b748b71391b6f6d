#include "engine/sampling.h"

#include <spdlog/spdlog.h>

#include "engine/tool_grammar.h"

#include <chat.h>
#include <json-schema-to-grammar.h>

#include <algorithm>
#include <random>
#include <stdexcept>

namespace armada::engine {

namespace {
// llama.cpp's GBNF parser recurses on nesting and walks rule chains; a hostile grammar could
// exhaust the stack before it says no. Bound both before handing it over.
void check_grammar_shape(const std::string & g) {
    constexpr int kMaxDepth = 256;
    constexpr size_t kMaxBytes = 256 * 1024;
    if (g.size() > kMaxBytes) throw std::invalid_argument("the grammar is larger than 256 KiB");
    int depth = 0, max_depth = 0;
    bool in_str = false, in_class = false;
    for (size_t i = 0; i < g.size(); ++i) {
        const char c = g[i];
        if ((in_str || in_class) && c == '\\') {
            ++i;
            continue;
        }
        if (in_str) {
            in_str = c != '"';
        } else if (in_class) {
            in_class = c != ']';
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[') {
            in_class = true;
        } else if (c == '(') {
            max_depth = std::max(max_depth, ++depth);
        } else if (c == ')') {
            --depth;
        }
    }
    if (max_depth > kMaxDepth) {
        throw std::invalid_argument("the grammar nests parentheses " + std::to_string(max_depth) +
                                    " deep; the limit is " + std::to_string(kMaxDepth));
    }
}

bool plain(const SamplingOptions & s, const ToolGrammar & t) {
    return !(t.chat && !t.chat->grammar.empty()) && s.grammar.empty() && s.json_schema.empty() && !s.json_object &&
           s.repeat_penalty == 1.0f && s.frequency_penalty == 0.0f && s.presence_penalty == 0.0f;
}

SamplerPtr chain(const Model & model, const SamplingOptions & s, const ToolGrammar & t, uint32_t seed) {
    common_params_sampling p;
    p.seed = seed;
    p.temp = s.temperature;
    p.top_p = s.top_p;
    p.top_k = s.top_k;
    p.min_p = s.min_p;
    p.penalty_repeat = s.repeat_penalty;
    p.penalty_last_n = s.repeat_last_n;
    p.penalty_freq = s.frequency_penalty;
    p.penalty_present = s.presence_penalty;
    p.logit_bias = s.logit_bias;
    p.no_perf = true;
    if (t.chat && !t.chat->grammar.empty()) {
        p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_TOOL_CALLS,
                                   constrain_tool_grammar(t.chat->grammar, t.require_call, t.parallel));
        spdlog::debug("tool-call grammar:\n{}", p.grammar.grammar);
        p.grammar_lazy = t.chat->grammar_lazy;
        p.generation_prompt = t.chat->generation_prompt;
        for (const auto & tok : t.chat->preserved_tokens) {
            auto ids = model.tokenize(tok, false, true);
            if (ids.size() == 1) p.preserved_tokens.insert(ids[0]);
        }
        for (const auto & trig : t.chat->grammar_triggers) {
            if (trig.type == COMMON_GRAMMAR_TRIGGER_TYPE_WORD) {
                auto ids = model.tokenize(trig.value, false, true);
                if (ids.size() == 1 && p.preserved_tokens.count(ids[0])) {
                    p.grammar_triggers.push_back({COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN, trig.value, ids[0]});
                    continue;
                }
            }
            p.grammar_triggers.push_back(trig);
        }
    } else if (!s.json_schema.empty() || s.json_object) {
        const std::string schema = s.json_object ? std::string(R"({"type":"object"})") : s.json_schema;
        try {
            p.grammar =
                common_grammar(COMMON_GRAMMAR_TYPE_OUTPUT_FORMAT, json_schema_to_grammar(common_json::parse(schema)));
        } catch (const std::exception & e) {
            throw std::invalid_argument(std::string("cannot use this JSON schema: ") + e.what());
        }
    } else if (!s.grammar.empty()) {
        check_grammar_shape(s.grammar);
        p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, s.grammar);
    }
    if (p.grammar.type == COMMON_GRAMMAR_TYPE_USER || p.grammar.type == COMMON_GRAMMAR_TYPE_OUTPUT_FORMAT) {
        // common_sampler_init leaks its sampler chain when the grammar does not parse (found
        // by ASan), so a grammar from the client is parsed once on its own first.
        llama_sampler * probe =
            llama_sampler_init_grammar(llama_model_get_vocab(model.get()), p.grammar.grammar.c_str(), "root");
        if (!probe) throw std::invalid_argument("invalid grammar: it does not parse, or its root rule is missing");
        llama_sampler_free(probe);
    }
    common_sampler * smpl = nullptr;
    try {
        smpl = common_sampler_init(model.get(), p);
    } catch (const std::exception & e) {
        throw std::invalid_argument(std::string("invalid sampling settings or grammar: ") + e.what());
    }
    if (!smpl) throw std::invalid_argument("invalid sampling settings or grammar");
    return SamplerPtr(smpl);
}

FastSamplerParams fast_params(const SamplingOptions & s, uint32_t seed) {
    FastSamplerParams p;
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    p.seed = seed;
    p.logit_bias = s.logit_bias;
    return p;
}
}  // namespace

void attach_sampler(GenRequest & req, const Model & model, const SamplingOptions & s, const ToolGrammar & t,
                    uint32_t seed) {
    if (plain(s, t)) {
        req.fast = std::make_unique<FastSampler>(fast_params(s, seed));
        return;
    }
    const bool no_penalties = s.repeat_penalty == 1.0f && s.frequency_penalty == 0.0f && s.presence_penalty == 0.0f;
    if (t.chat && !t.chat->grammar.empty() && !t.chat->grammar_lazy && s.grammar.empty() && s.json_schema.empty() &&
        !s.json_object && no_penalties) {
        // A tool call is required: sample with the fast grammar path (see grammar_fast.h).
        try {
            const std::string g = constrain_tool_grammar(t.chat->grammar, t.require_call, t.parallel);
            spdlog::debug("tool-call grammar:\n{}", g);
            req.gfast = std::make_unique<GrammarFast>(model, g, t.chat->generation_prompt, fast_params(s, seed));
        } catch (const std::invalid_argument & e) {
            spdlog::debug("fast grammar path not used: {}", e.what());
            req.gfast.reset();
        }
    }
    if (!req.gfast) req.sampler = chain(model, s, t, seed);
    if (t.chat) {
        for (const auto & tok : t.chat->preserved_tokens) {
            auto ids = model.tokenize(tok, false, true);
            if (ids.size() == 1) req.special_ok.push_back(ids[0]);
        }
    }
}

uint32_t choice_seed(const SamplingOptions & s, int32_t i) {
    if (s.seed) return *s.seed + uint32_t(i);
    thread_local std::mt19937 rng(std::random_device{}());
    return rng();
}

}  // namespace armada::engine

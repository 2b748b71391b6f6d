#pragma once

#include "engine/request.h"

#include <llama.h>

#include <optional>
#include <string>
#include <vector>

struct common_chat_params;

namespace armada::engine {

//! How to sample one request, in native types; the API maps OpenAI fields onto it and agent
//! specs carry their defaults in it.
struct SamplingOptions {
    float temperature = 0.8f;
    float top_p = 0.95f;
    int32_t top_k = 40;
    float min_p = 0.05f;
    float repeat_penalty = 1.0f;
    int32_t repeat_last_n = 64;
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    std::optional<uint32_t> seed;
    std::vector<llama_logit_bias> logit_bias;
    int32_t max_tokens = -1;
    int32_t logprobs = -1;  // -1: none; 0..20: each token's log-probability and that many alternatives
    std::vector<std::string> stop;
    int32_t n = 1;
    bool stream = false;
    bool include_usage = false;
    std::string grammar;       // GBNF (llama.cpp extension)
    std::string json_schema;   // response_format json_schema, serialised
    bool json_object = false;  // response_format json_object
};

//! Grammar-related inputs from the chat template, for tool calls.
struct ToolGrammar {
    const common_chat_params * chat = nullptr;
    bool require_call = false;
    bool parallel = true;
};

//! Gives `req` its sampler: the fused FastSampler for plain requests, llama.cpp's chain when a
//! grammar, JSON schema or repetition penalty is involved. Throws std::invalid_argument for a
//! grammar or schema llama.cpp rejects.
void attach_sampler(GenRequest & req, const Model & model, const SamplingOptions & s, const ToolGrammar & tools,
                    uint32_t seed);

//! The seed of choice `i`: the requested seed plus i, or a random one.
uint32_t choice_seed(const SamplingOptions & s, int32_t i);

}  // namespace armada::engine

#pragma once

#include "api/json_util.h"
#include "engine/sampling.h"

#include <chat.h>
#include <common.h>

#include <optional>
#include <string>
#include <vector>

namespace armada::api {

//! Sampling fields common to chat and text completions, validated.
using SamplingSpec = engine::SamplingOptions;

//! A chat request mapped to llama.cpp's chat types.
struct ChatSpec {
    std::vector<common_chat_msg> messages;
    std::vector<common_chat_tool> tools;
    common_chat_tool_choice tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    std::string named_tool;  // tool_choice {"type":"function","function":{"name":...}}
    bool parallel_tool_calls = true;
    SamplingSpec sampling;
};

//! Caps on what one request may ask for.
struct RequestLimits {
    int32_t max_n = 8;
    int32_t max_stop = 16;
    int32_t max_stop_len = 256;
    int32_t max_tools = 128;
    int32_t max_tokens = 0;  // tokens one sequence holds: more cannot be generated; 0 = no cap
};

//! Validates and maps the sampling fields; `n_vocab` bounds logit_bias token ids.
//! Throws ApiError(400) naming the offending field.
SamplingSpec parse_sampling(const json & body, int32_t n_vocab, const RequestLimits & lim);

//! Validates and maps a /v1/chat/completions body. Throws ApiError(400).
ChatSpec parse_chat(const json & body, int32_t n_vocab, const RequestLimits & lim);

//! Validates one tool's JSON schema enough that grammar generation will not fail on it.
void check_tool_schema(const json & params, const std::string & tool_name);

}  // namespace armada::api

#include "gateway/pool_request.h"

#include "api/errors.h"

namespace armada::gateway {

using api::ApiError;
using api::json;

namespace {

// The sampling and output fields a node reads for both routes (api/openai_map.cpp).
constexpr const char * kSampling[] = {
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "seed",
    "stop",
    "n",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "grammar",
    "json_schema",
    "response_format",
};
constexpr const char * kChatOnly[] = {"messages", "tools", "tool_choice", "parallel_tool_calls"};

void check_prompt(const json & body, int32_t n_vocab) {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
    const json * p = &*it;
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
    if (p->is_string()) return;
    if (!p->is_array()) throw ApiError(400, "'prompt' must be a string or an array of token ids", "prompt");
    for (const auto & t : *p) {
        if (!t.is_number_integer()) throw ApiError(400, "'prompt' must be a string or an array of token ids", "prompt");
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= n_vocab)
            throw ApiError(400, "prompt token " + std::to_string(id) + " is outside the vocabulary", "prompt");
    }
}

//! Cached-token counts and timings out of one answer object (a whole reply or a stream chunk).
void scrub(json & j) {
    if (!j.is_object()) return;
    j.erase("timings");
    j.erase("prompt_progress");
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        u->erase("prompt_tokens_details");
        u->erase("cached_tokens");
        u->erase("input_tokens_details");
    }
}

}  // namespace

std::string pool_request_body(const json & body, const PoolRequestOptions & o) {
    if (!body.is_object()) throw ApiError(400, "request body must be a JSON object");
    api::RequestLimits lim = o.limits;
    if (o.context > 0) lim.max_tokens = int32_t(std::min<int64_t>(o.context, INT32_MAX));
    // The node's own checks, with the node's messages.
    api::SamplingSpec s;
    if (o.chat)
        s = api::parse_chat(body, o.n_vocab, lim).sampling;
    else {
        s = api::parse_sampling(body, o.n_vocab, lim);
        check_prompt(body, o.n_vocab);
    }
    json out = json::object();
    for (const char * k : kSampling) {
        if (auto it = body.find(k); it != body.end() && !it->is_null()) out[k] = *it;
    }
    if (o.chat) {
        for (const char * k : kChatOnly) {
            if (auto it = body.find(k); it != body.end() && !it->is_null()) out[k] = *it;
        }
    } else {
        out["prompt"] = body["prompt"];
    }
    // llama.cpp's n_probs, which a node honours, in the fields any OpenAI server reads.
    if (body.contains("n_probs") && s.logprobs > 0) {
        if (o.chat) {
            out["logprobs"] = true;
            out["top_logprobs"] = s.logprobs;
        } else {
            out["logprobs"] = s.logprobs;
        }
    }
    out["model"] = o.model;
    if (!o.cache_salt.empty()) out["cache_salt"] = o.cache_salt;
    return api::dump(out);
}

std::string scrub_pool_json(std::string_view text) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return std::string(text);
    scrub(j);
    return api::dump(j);
}

std::string PoolStreamScrubber::feed(std::string_view chunk) {
    std::string out;
    reader_.feed(chunk, [&](net::SseEvent & ev) {
        out += rewrite(ev);
        return true;
    });
    return out;
}

std::string PoolStreamScrubber::flush() {
    // An event the upstream never ended: scrubbed as if it had been.
    std::string out;
    reader_.finish([&](net::SseEvent & ev) {
        out += rewrite(ev);
        return true;
    });
    return out;
}

std::string PoolStreamScrubber::rewrite(const net::SseEvent & ev) {
    if (!ev.has_data) return ev.raw;  // a comment or a `retry`: as it came
    return net::sse_event(ev.event, scrub_event_data(ev.data), ev.id);
}

std::string scrub_event_data(const std::string & data) {
    // One JSON object, on one line or several; else each line by itself, as a client that
    // parses every `data:` line alone would read them.
    json j = json::parse(data, nullptr, false);
    if (j.is_object()) {
        scrub(j);
        return api::dump(j);
    }
    const auto lines = net::data_lines(data);
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
        if (i > 0) out += '\n';
        out += scrub_pool_json(lines[i]);
    }
    return out;
}

}  // namespace armada::gateway

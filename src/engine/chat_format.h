#pragma once

#include "engine/model.h"
#include "engine/request.h"
#include "engine/sampling.h"

#include <chat.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace armada::engine {

//! One rendered model turn: the prompt, and what is needed to constrain and parse the reply.
struct ChatTurn {
    common_chat_params params;
    common_chat_parser_params parser;
    Tokens prompt;
    bool tools_on = false;
    bool require_call = false;
    bool parallel = true;
};

//! The model's chat template, tool-call grammar and output parser, through llama.cpp's common
//! chat API. Const and thread-safe after construction; used by the API and the agent loop.
class ChatFormat {
  public:
    explicit ChatFormat(std::shared_ptr<Model> model);
    ~ChatFormat();

    //! Renders messages and tools into a prompt. Throws std::invalid_argument when the template
    //! rejects the messages.
    ChatTurn render(const std::vector<common_chat_msg> & messages, const std::vector<common_chat_tool> & tools,
                    common_chat_tool_choice choice, bool parallel) const;

    //! A generation request for `turn` with its sampler, stops and token limits. Throws
    //! std::invalid_argument for a prompt longer than `n_ctx_seq` or a rejected grammar.
    std::unique_ptr<GenRequest> request(const ChatTurn & turn, const SamplingOptions & s, int32_t n_ctx_seq,
                                        uint32_t seed) const;

    //! Parses model output. Output the format does not accept comes back as plain content.
    common_chat_msg parse(const ChatTurn & turn, const std::string & text, bool partial) const;
    //! Like parse, but reports a failure instead of falling back (for partial output mid-stream).
    std::optional<common_chat_msg> try_parse(const ChatTurn & turn, const std::string & text, bool partial) const;

    const Model & model() const { return *model_; }

  private:
    std::shared_ptr<Model> model_;
    common_chat_templates_ptr templates_;
};

//! Request for raw tokens (no template), for /v1/completions.
std::unique_ptr<GenRequest> plain_request(const Model & model, const Tokens & prompt, const SamplingOptions & s,
                                          int32_t n_ctx_seq, uint32_t seed);

//! Thrown when a prompt does not fit one sequence; carries both counts.
struct ContextOverflow : std::invalid_argument {
    ContextOverflow(size_t prompt, int32_t ctx)
        : std::invalid_argument("the prompt has " + std::to_string(prompt) +
                                " tokens but each sequence's context holds " + std::to_string(ctx) +
                                "; shorten the input or start the server with a larger -c") {}
};

}  // namespace armada::engine

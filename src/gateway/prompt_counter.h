#pragma once

#include "api/json_util.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace armada::engine {
class ChatFormat;
class Model;
}  // namespace armada::engine

namespace armada::gateway {

//! Counts a request's prompt tokens as a node would: the model's chat template renders the
//! messages and tools, and the model's tokenizer counts the result. Only the vocabulary and the
//! metadata of the GGUF are loaded (no weights). Thread-safe.
class PromptCounter {
  public:
    //! nullptr with `error` when the file cannot be loaded.
    static std::unique_ptr<PromptCounter> load(const std::string & path, std::string & error);
    ~PromptCounter();

    //! Tokens of a /v1/chat/completions body's prompt; nullopt for a body a node would refuse
    //! (it answers that with its own 400). When a bound shows that the prompt holds at most
    //! `enough` tokens, the bound comes back instead and nothing is rendered: a token covers at
    //! least one byte, and the prompt is the body's text plus the template's own (measured at
    //! load, per message and once). Requests with tools are always counted.
    std::optional<int64_t> chat(const api::json & body, size_t body_bytes = 0, int64_t enough = -1) const;
    //! Tokens of a /v1/completions body's prompt (a string, or token ids).
    std::optional<int64_t> completion(const api::json & body) const;

  private:
    PromptCounter() = default;
    std::shared_ptr<engine::Model> model_;
    std::unique_ptr<engine::ChatFormat> format_;
    int64_t fixed_bytes_ = 0;    // the template's text once per prompt (at most)
    int64_t message_bytes_ = 0;  // and per message (at most)
};

}  // namespace armada::gateway

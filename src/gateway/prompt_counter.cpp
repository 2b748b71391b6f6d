#include "gateway/prompt_counter.h"

#include "api/openai_map.h"
#include "engine/chat_format.h"
#include "engine/model.h"

namespace armada::gateway {

std::unique_ptr<PromptCounter> PromptCounter::load(const std::string & path, std::string & error) {
    engine::ModelLoadOptions o;
    o.vocab_only = true;
    auto m = engine::Model::load(path, {}, error, o);
    if (!m) return nullptr;
    std::unique_ptr<PromptCounter> c(new PromptCounter());
    c->model_ = m;
    try {
        c->format_ = std::make_unique<engine::ChatFormat>(m);
    } catch (const std::exception & e) {
        error = "the chat template of " + path + " cannot be used: " + e.what();
        return nullptr;
    }
    return c;
}

PromptCounter::~PromptCounter() = default;

std::optional<int64_t> PromptCounter::chat(const api::json & body) const {
    try {
        const api::ChatSpec spec = api::parse_chat(body, model_->n_vocab(), api::RequestLimits{});
        const auto turn = format_->render(spec.messages, spec.tools, spec.tool_choice, spec.parallel_tool_calls);
        return int64_t(turn.prompt.size());
    } catch (const std::exception &) {
        return std::nullopt;
    }
}

std::optional<int64_t> PromptCounter::completion(const api::json & body) const {
    auto it = body.find("prompt");
    if (it == body.end()) return std::nullopt;
    const api::json * p = &*it;
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
    if (p->is_string()) return int64_t(model_->tokenize(p->get<std::string>(), true, false).size());
    if (p->is_array()) return int64_t(p->size());
    return std::nullopt;
}

}  // namespace armada::gateway

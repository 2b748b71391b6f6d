#include "gateway/prompt_counter.h"

#include "api/openai_map.h"
#include "engine/chat_format.h"
#include "engine/model.h"

#include <algorithm>

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
        // What the template adds around messages, for the bound in `chat`: empty messages of
        // each role, alone and one more at a time.
        auto bytes = [&](const std::vector<std::pair<std::string, std::string>> & msgs) {
            std::vector<common_chat_msg> v;
            for (const auto & [role, text] : msgs) {
                common_chat_msg x;
                x.role = role;
                x.content = text;
                v.push_back(x);
            }
            std::string text;
            for (auto t : c->format_->render(v, {}, COMMON_CHAT_TOOL_CHOICE_AUTO, true).prompt)
                text += m->piece(t, true);
            return int64_t(text.size());
        };
        const int64_t user = bytes({{"user", ""}});
        const int64_t sys = bytes({{"system", ""}, {"user", ""}});
        c->fixed_bytes_ = std::max(user, sys);
        for (const char * role : {"user", "assistant", "system", "tool"}) {
            try {
                c->message_bytes_ = std::max(c->message_bytes_, bytes({{"user", ""}, {role, ""}, {"user", ""}}) - user);
            } catch (const std::exception &) {
                // A template that refuses this order says nothing about its overhead.
            }
        }
        c->message_bytes_ = std::max<int64_t>(c->message_bytes_, 64);
    } catch (const std::exception & e) {
        error = "the chat template of " + path + " cannot be used: " + e.what();
        return nullptr;
    }
    return c;
}

PromptCounter::~PromptCounter() = default;

std::optional<int64_t> PromptCounter::chat(const api::json & body, size_t body_bytes, int64_t enough) const {
    if (enough >= 0 && body_bytes > 0 && !(body.contains("tools") && !body["tools"].empty()) &&
        body.contains("messages") && body["messages"].is_array()) {
        // Twice the template's measured text, with room to spare: still far below any threshold
        // worth routing on, and safe against a template that says a little more for some inputs.
        const int64_t n = int64_t(body["messages"].size());
        const int64_t bound = int64_t(body_bytes) + 2 * (fixed_bytes_ + message_bytes_ * n) + 16;
        if (bound <= enough) return bound;
    }
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
    if (p->is_array() && !p->empty() &&
        std::all_of(p->begin(), p->end(), [](const auto & x) { return x.is_string(); })) {
        // Several prompts: the longest decides where they fit.
        int64_t most = 0;
        for (const auto & x : *p)
            most = std::max<int64_t>(most, int64_t(model_->tokenize(x.get<std::string>(), true, false).size()));
        return most;
    }
    if (p->is_array()) return int64_t(p->size());
    return std::nullopt;
}

}  // namespace armada::gateway

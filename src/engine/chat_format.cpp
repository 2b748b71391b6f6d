#include "engine/chat_format.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace armada::engine {

ChatFormat::ChatFormat(std::shared_ptr<Model> model) : model_(std::move(model)) {
    templates_ = common_chat_templates_init(model_->get(), "");
}

ChatFormat::~ChatFormat() = default;

ChatTurn ChatFormat::render(const std::vector<common_chat_msg> & messages, const std::vector<common_chat_tool> & tools,
                            common_chat_tool_choice choice, bool parallel) const {
    common_chat_templates_inputs in;
    in.messages = messages;
    in.tools = tools;
    in.tool_choice = tools.empty() ? COMMON_CHAT_TOOL_CHOICE_NONE : choice;
    in.parallel_tool_calls = parallel;
    in.add_generation_prompt = true;
    in.use_jinja = true;
    ChatTurn t;
    try {
        t.params = common_chat_templates_apply(templates_.get(), in);
    } catch (const std::exception & e) {
        throw std::invalid_argument(std::string("the chat template rejected these messages: ") + e.what());
    }
    t.prompt = model_->tokenize(t.params.prompt, true, true);
    t.tools_on = !tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    t.require_call = t.tools_on && in.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    t.parallel = parallel;
    t.parser = common_chat_parser_params(t.params);
    if (!t.params.parser.empty()) t.parser.parser.load(t.params.parser);
    t.parser.parse_tool_calls = t.tools_on;
    return t;
}

namespace {
std::unique_ptr<GenRequest> base(const Tokens & prompt, const SamplingOptions & s, int32_t n_ctx_seq) {
    if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
    if (int32_t(prompt.size()) >= n_ctx_seq) throw ContextOverflow(prompt.size(), n_ctx_seq);
    auto r = std::make_unique<GenRequest>();
    r->prompt = prompt;
    r->max_tokens = s.max_tokens;
    r->logprobs = s.logprobs;
    r->stop = s.stop;
    return r;
}
}  // namespace

std::unique_ptr<GenRequest> ChatFormat::request(const ChatTurn & turn, const SamplingOptions & s, int32_t n_ctx_seq,
                                                uint32_t seed) const {
    auto r = base(turn.prompt, s, n_ctx_seq);
    for (const auto & stop : turn.params.additional_stops)
        r->stop.push_back(stop);
    ToolGrammar tg;
    if (turn.tools_on) {
        tg.chat = &turn.params;
        tg.require_call = turn.require_call;
        tg.parallel = turn.parallel;
    }
    attach_sampler(*r, *model_, s, tg, seed);
    return r;
}

common_chat_msg ChatFormat::parse(const ChatTurn & turn, const std::string & text, bool partial) const {
    common_chat_msg msg;
    try {
        msg = common_chat_parse(text, partial, turn.parser);
    } catch (const std::exception &) {
        msg = common_chat_msg();
        msg.content = text;
    }
    msg.role = "assistant";
    if (!partial) {
        // A call whose arguments are not a JSON object llama.cpp can read (cut off, or a number
        // like 1e800 that overflows) is not a call: the template would refuse it when the
        // conversation is rendered again.
        std::erase_if(msg.tool_calls, [](const common_chat_tool_call & c) {
            try {
                return !nlohmann::ordered_json::parse(c.arguments).is_object();
            } catch (const std::exception &) {
                return true;
            }
        });
    }
    return msg;
}

std::optional<common_chat_msg> ChatFormat::try_parse(const ChatTurn & turn, const std::string & text,
                                                     bool partial) const {
    try {
        common_chat_msg msg = common_chat_parse(text, partial, turn.parser);
        msg.role = "assistant";
        return msg;
    } catch (const std::exception &) {
        return std::nullopt;
    }
}

std::unique_ptr<GenRequest> plain_request(const Model & model, const Tokens & prompt, const SamplingOptions & s,
                                          int32_t n_ctx_seq, uint32_t seed) {
    auto r = base(prompt, s, n_ctx_seq);
    attach_sampler(*r, model, s, ToolGrammar{}, seed);
    return r;
}

}  // namespace armada::engine

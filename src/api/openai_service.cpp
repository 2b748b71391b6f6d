#include "api/openai_service.h"

#include "api/errors.h"
#include "api/tool_grammar.h"

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <json-schema-to-grammar.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <mutex>
#include <random>

namespace armada::api {

namespace net = boost::asio;
using engine::FinishReason;
using engine::GenEvent;

std::string random_id(const std::string & prefix, size_t n) {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    thread_local std::mt19937_64 rng(std::random_device{}());
    std::string s = prefix;
    for (size_t i = 0; i < n; ++i) s += alphabet[rng() % (sizeof(alphabet) - 1)];
    return s;
}

namespace {
int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string sse(const json & j) { return "data: " + dump(j) + "\n\n"; }

json tool_call_json(const common_chat_tool_call & c) {
    return {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}
}  // namespace

//! One HTTP request in flight: its choices, and how to render their events. Engine events are
//! queued under `mu` and rendered on `strand`, never on the engine thread.
struct OpenAIService::Job : std::enable_shared_from_this<Job> {
    struct Choice {
        std::string text;
        common_chat_msg parsed;  // last parse, for streaming diffs
        std::vector<std::string> tool_ids;
        bool done = false;
        FinishReason finish = FinishReason::Stop;
        std::string error;
        int32_t n_prompt = 0, n_cached = 0, n_generated = 0;
        std::shared_ptr<std::atomic<bool>> cancelled;
        bool role_sent = false;
    };

    bool is_chat = true;
    bool stream = false, include_usage = false;
    bool parse_tools = false;
    common_chat_parser_params parser;
    std::string id, model;
    int64_t created = unix_now();
    std::shared_ptr<Responder> out;
    std::vector<Choice> choices;
    net::strand<net::any_io_executor> strand;
    engine::Engine * engine = nullptr;
    obs::Registry * metrics = nullptr;

    std::mutex mu;
    std::vector<std::pair<size_t, GenEvent>> events;  // guarded by mu
    bool scheduled = false;                           // guarded by mu
    size_t n_done = 0;

    explicit Job(net::any_io_executor io) : strand(net::make_strand(io)) {}

    engine::GenSink sink(size_t i) {
        return [self = shared_from_this(), i](GenEvent && ev) { self->push(i, std::move(ev)); };
    }

    void push(size_t i, GenEvent && ev) {
        bool post = false;
        {
            std::lock_guard lk(mu);
            events.emplace_back(i, std::move(ev));
            post = !scheduled;
            scheduled = true;
        }
        if (post) net::post(strand, [self = shared_from_this()] { self->drain(); });
    }

    void drain() {
        std::vector<std::pair<size_t, GenEvent>> batch;
        {
            std::lock_guard lk(mu);
            batch.swap(events);
            scheduled = false;
        }
        for (auto & [i, ev] : batch) on_event(i, std::move(ev));
    }

    common_chat_msg parse(Choice & c, bool partial) {
        common_chat_msg msg;
        if (!is_chat) {
            msg.content = c.text;
            return msg;
        }
        try {
            msg = common_chat_parse(c.text, partial, parser);
        } catch (const std::exception & e) {
            // Output the format does not accept is still an answer: give it back as content.
            if (partial) return c.parsed;
            msg = common_chat_msg();
            msg.content = c.text;
        }
        msg.role = "assistant";
        msg.set_tool_call_ids(c.tool_ids, [] { return random_id("call_"); });
        return msg;
    }

    void on_event(size_t i, GenEvent && ev) {
        Choice & c = choices[i];
        if (ev.kind == GenEvent::Kind::Text) {
            c.text += ev.text;
            if (stream) stream_delta(i, c, true);
            return;
        }
        c.done = true;
        c.finish = ev.finish;
        c.error = ev.error;
        c.n_prompt = ev.n_prompt;
        c.n_cached = ev.n_cached;
        c.n_generated = ev.n_generated;
        ++n_done;
        if (stream) {
            stream_delta(i, c, false);
            stream_finish(i, c);
        }
        if (n_done == choices.size()) complete();
    }

    json chunk_base() const {
        json j = {{"id", id},
                  {"object", is_chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", created},
                  {"model", model},
                  {"system_fingerprint", "armada-" ARMADA_VERSION}};
        if (include_usage) j["usage"] = nullptr;
        return j;
    }

    void emit_delta(size_t i, json delta) {
        json j = chunk_base();
        if (is_chat && !choices[i].role_sent) {
            // OpenAI's first delta of a choice carries the role.
            choices[i].role_sent = true;
            emit_delta(i, json{{"role", "assistant"}, {"content", ""}});
            if (delta.empty()) return;
        }
        if (is_chat) {
            j["choices"] = json::array({{{"index", i}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}});
        } else {
            j["choices"] = json::array(
                {{{"index", i}, {"text", delta["content"]}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
        }
        out->write(sse(j));
    }

    void stream_delta(size_t i, Choice & c, bool partial) {
        common_chat_msg msg = parse(c, partial);
        for (const auto & d : common_chat_msg_diff::compute_diffs(c.parsed, msg)) {
            json delta = json::object();
            if (!d.content_delta.empty()) delta["content"] = d.content_delta;
            if (d.tool_call_index != std::string::npos) {
                json tc = {{"index", d.tool_call_index}};
                if (!d.tool_call_delta.id.empty() || !d.tool_call_delta.name.empty()) {
                    tc["id"] = d.tool_call_delta.id;
                    tc["type"] = "function";
                    tc["function"] = {{"name", d.tool_call_delta.name}, {"arguments", d.tool_call_delta.arguments}};
                } else {
                    tc["function"] = {{"arguments", d.tool_call_delta.arguments}};
                }
                delta["tool_calls"] = json::array({tc});
            }
            if (!delta.empty()) emit_delta(i, std::move(delta));
        }
        c.parsed = std::move(msg);
    }

    std::string finish_reason(const Choice & c) const {
        if (c.finish == FinishReason::Length) return "length";
        if (c.finish == FinishReason::Error) return "error";
        if (is_chat && !c.parsed.tool_calls.empty()) return "tool_calls";
        return "stop";
    }

    void stream_finish(size_t i, Choice & c) {
        if (is_chat && !c.role_sent) emit_delta(i, json::object());
        json j = chunk_base();
        if (is_chat) {
            j["choices"] = json::array({{{"index", i}, {"delta", json::object()}, {"logprobs", nullptr},
                                         {"finish_reason", finish_reason(c)}}});
        } else {
            j["choices"] = json::array({{{"index", i}, {"text", ""}, {"logprobs", nullptr},
                                         {"finish_reason", finish_reason(c)}}});
        }
        out->write(sse(j));
    }

    json usage() const {
        int32_t prompt = choices.empty() ? 0 : choices[0].n_prompt, cached = 0, gen = 0;
        for (const auto & c : choices) {
            gen += c.n_generated;
            cached = std::max(cached, c.n_cached);
        }
        return {{"prompt_tokens", prompt},
                {"completion_tokens", gen},
                {"total_tokens", prompt + gen},
                {"prompt_tokens_details", {{"cached_tokens", cached}}}};
    }

    void complete() {
        const std::string route = is_chat ? "/v1/chat/completions" : "/v1/completions";
        for (const auto & c : choices) {
            if (c.finish == FinishReason::Error) {
                metrics->counter("armada_requests_total", "HTTP requests by route and status",
                                 {{"route", route}, {"code", "500"}})
                    .inc();
                if (stream) {
                    out->write(sse(json{{"error", {{"message", c.error}, {"type", "server_error"}}}}));
                    out->end();
                } else {
                    out->send(500, "application/json", error_body(500, c.error));
                }
                return;
            }
        }
        metrics->counter("armada_requests_total", "HTTP requests by route and status", {{"route", route}, {"code", "200"}})
            .inc();
        if (stream) {
            if (include_usage) {
                json j = chunk_base();
                j["choices"] = json::array();
                j["usage"] = usage();
                out->write(sse(j));
            }
            out->write("data: [DONE]\n\n");
            out->end();
            return;
        }
        json res = {{"id", id},
                    {"object", is_chat ? "chat.completion" : "text_completion"},
                    {"created", created},
                    {"model", model},
                    {"system_fingerprint", "armada-" ARMADA_VERSION}};
        json arr = json::array();
        for (size_t i = 0; i < choices.size(); ++i) {
            Choice & c = choices[i];
            if (!is_chat) {
                arr.push_back({{"index", i}, {"text", c.text}, {"logprobs", nullptr}, {"finish_reason", finish_reason(c)}});
                continue;
            }
            c.parsed = parse(c, false);
            json msg = {{"role", "assistant"}};
            msg["content"] = c.parsed.content.empty() && !c.parsed.tool_calls.empty() ? json(nullptr)
                                                                                       : json(c.parsed.content);
            if (!c.parsed.tool_calls.empty()) {
                json calls = json::array();
                for (const auto & tc : c.parsed.tool_calls) calls.push_back(tool_call_json(tc));
                msg["tool_calls"] = calls;
            }
            if (!c.parsed.reasoning_content.empty()) msg["reasoning_content"] = c.parsed.reasoning_content;
            arr.push_back({{"index", i}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", finish_reason(c)}});
        }
        res["choices"] = arr;
        res["usage"] = usage();
        out->send(200, "application/json", dump(res));
    }
};

OpenAIService::OpenAIService(std::shared_ptr<engine::Model> model, engine::Engine & engine, obs::Registry & metrics,
                             net::any_io_executor io, RequestLimits limits)
    : model_(std::move(model)), engine_(engine), metrics_(metrics), io_(std::move(io)), limits_(limits) {
    templates_ = common_chat_templates_init(model_->get(), "");
}

OpenAIService::~OpenAIService() = default;

engine::SamplerPtr OpenAIService::make_sampler(const SamplingSpec & s, const common_chat_params * chat,
                                               bool require_call, bool parallel, uint32_t seed) const {
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
    if (chat && !chat->grammar.empty()) {
        p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_TOOL_CALLS,
                                   constrain_tool_grammar(chat->grammar, require_call, parallel));
        p.grammar_lazy = chat->grammar_lazy;
        p.generation_prompt = chat->generation_prompt;
        for (const auto & t : chat->preserved_tokens) {
            auto ids = model_->tokenize(t, false, true);
            if (ids.size() == 1) p.preserved_tokens.insert(ids[0]);
        }
        for (const auto & trig : chat->grammar_triggers) {
            if (trig.type == COMMON_GRAMMAR_TRIGGER_TYPE_WORD) {
                auto ids = model_->tokenize(trig.value, false, true);
                if (ids.size() == 1 && p.preserved_tokens.count(ids[0])) {
                    p.grammar_triggers.push_back({COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN, trig.value, ids[0]});
                    continue;
                }
            }
            p.grammar_triggers.push_back(trig);
        }
    } else if (!s.json_schema.empty() || s.json_object) {
        const std::string schema = s.json_object ? std::string(R"({"type":"object"})") : s.json_schema;
        std::string gbnf;
        try {
            gbnf = json_schema_to_grammar(common_json::parse(schema));
        } catch (const std::exception & e) {
            throw ApiError(400, std::string("cannot use this JSON schema: ") + e.what(), "response_format");
        }
        p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_OUTPUT_FORMAT, gbnf);
    } else if (!s.grammar.empty()) {
        p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, s.grammar);
    }
    common_sampler * smpl = nullptr;
    try {
        smpl = common_sampler_init(model_->get(), p);
    } catch (const std::exception & e) {
        throw ApiError(400, std::string("invalid sampling settings or grammar: ") + e.what(), "grammar");
    }
    if (!smpl) throw ApiError(400, "invalid sampling settings or grammar", "grammar");
    return engine::SamplerPtr(smpl);
}

namespace {
// Plain sampling (no grammar, no repetition penalties) takes the fused fast path.
bool plain_sampling(const SamplingSpec & s) {
    return s.grammar.empty() && s.json_schema.empty() && !s.json_object && s.repeat_penalty == 1.0f &&
           s.frequency_penalty == 0.0f && s.presence_penalty == 0.0f;
}

std::unique_ptr<engine::FastSampler> fast_sampler(const SamplingSpec & s, uint32_t seed) {
    engine::FastSamplerParams p;
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    p.seed = seed;
    p.logit_bias = s.logit_bias;
    return std::make_unique<engine::FastSampler>(std::move(p));
}

uint32_t pick_seed(const SamplingSpec & s, int32_t i) {
    if (s.seed) return *s.seed + uint32_t(i);
    thread_local std::mt19937 rng(std::random_device{}());
    return rng();
}

std::unique_ptr<engine::GenRequest> base_request(const engine::Tokens & prompt, const SamplingSpec & s,
                                                 int32_t n_ctx_seq) {
    if (int32_t(prompt.size()) >= n_ctx_seq) {
        throw ApiError(400, "the prompt has " + std::to_string(prompt.size()) +
                                " tokens but each sequence's context holds " + std::to_string(n_ctx_seq) +
                                "; shorten the input or start the server with a larger -c",
                       "messages", "context_length_exceeded");
    }
    if (prompt.empty()) throw ApiError(400, "the prompt is empty", "prompt");
    auto r = std::make_unique<engine::GenRequest>();
    r->prompt = prompt;
    r->max_tokens = s.max_tokens;
    r->stop = s.stop;
    return r;
}
}  // namespace

void OpenAIService::submit(std::shared_ptr<Job> job, std::vector<std::unique_ptr<engine::GenRequest>> reqs) {
    job->engine = &engine_;
    job->metrics = &metrics_;
    for (size_t i = 0; i < reqs.size(); ++i) {
        job->choices[i].cancelled = reqs[i]->cancelled;
        reqs[i]->sink = job->sink(i);
    }
    // All choices or none: a partially accepted request would leave the client waiting.
    for (size_t i = 0; i < reqs.size(); ++i) {
        const auto st = engine_.submit(std::move(reqs[i]));
        if (st != engine::SubmitStatus::Accepted) {
            for (size_t k = 0; k < i; ++k) job->choices[k].cancelled->store(true);
            engine_.wake();
            ApiError e(st == engine::SubmitStatus::QueueFull ? 429 : 503,
                       st == engine::SubmitStatus::QueueFull ? "the server is at capacity; retry shortly"
                                                             : "the server is shutting down",
                       {}, st == engine::SubmitStatus::QueueFull ? "queue_full" : "unavailable");
            e.retry_after_s = 1;
            throw e;
        }
    }
    auto weak = std::weak_ptr<Job>(job);
    job->out->on_close([weak, eng = &engine_] {
        if (auto j = weak.lock()) {
            for (auto & c : j->choices) c.cancelled->store(true);
            eng->wake();
        }
    });
    // Runs inline on the connection's strand, so it precedes any chunk the engine produces.
    if (job->stream) job->out->start_stream(200);
}

void OpenAIService::chat(const json & body, std::shared_ptr<Responder> out) {
    ChatSpec spec = parse_chat(body, model_->n_vocab(), limits_);
    common_chat_templates_inputs in;
    in.messages = spec.messages;
    in.tools = spec.tools;
    in.tool_choice = spec.tools.empty() ? COMMON_CHAT_TOOL_CHOICE_NONE : spec.tool_choice;
    in.parallel_tool_calls = spec.parallel_tool_calls;
    in.add_generation_prompt = true;
    in.use_jinja = true;
    common_chat_params cp;
    try {
        cp = common_chat_templates_apply(templates_.get(), in);
    } catch (const std::exception & e) {
        throw ApiError(400, std::string("the chat template rejected these messages: ") + e.what(), "messages");
    }
    const engine::Tokens prompt = model_->tokenize(cp.prompt, true, true);
    spdlog::debug("chat: format {} grammar {} bytes lazy {} triggers {} parser {} bytes", common_chat_format_name(cp.format),
                  cp.grammar.size(), cp.grammar_lazy, cp.grammar_triggers.size(), cp.parser.size());
    spdlog::trace("chat grammar:\n{}\ngeneration prompt: [{}]", cp.grammar, cp.generation_prompt);
    const bool tools_on = !spec.tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;

    auto job = std::make_shared<Job>(io_);
    job->is_chat = true;
    job->stream = spec.sampling.stream;
    job->include_usage = spec.sampling.include_usage;
    job->id = random_id("chatcmpl-");
    job->model = model_->id();
    job->out = out;
    job->parser = common_chat_parser_params(cp);
    if (!cp.parser.empty()) job->parser.parser.load(cp.parser);
    job->parser.parse_tool_calls = tools_on;
    job->choices.resize(size_t(spec.sampling.n));

    std::vector<std::unique_ptr<engine::GenRequest>> reqs;
    for (int32_t i = 0; i < spec.sampling.n; ++i) {
        auto r = base_request(prompt, spec.sampling, engine_.n_ctx_seq());
        for (const auto & s : cp.additional_stops) r->stop.push_back(s);
        const uint32_t seed = pick_seed(spec.sampling, i);
        if (!tools_on && plain_sampling(spec.sampling)) {
            r->fast = fast_sampler(spec.sampling, seed);
        } else {
            r->sampler = make_sampler(spec.sampling, tools_on ? &cp : nullptr,
                                      in.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED, spec.parallel_tool_calls,
                                      seed);
        }
        for (const auto & t : cp.preserved_tokens) {
            auto ids = model_->tokenize(t, false, true);
            if (ids.size() == 1) r->special_ok.push_back(ids[0]);
        }
        reqs.push_back(std::move(r));
    }
    submit(job, std::move(reqs));
}

void OpenAIService::completion(const json & body, std::shared_ptr<Responder> out) {
    SamplingSpec s = parse_sampling(body, model_->n_vocab(), limits_);
    engine::Tokens prompt;
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
    const json * p = &*it;
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
    if (p->is_string()) {
        prompt = model_->tokenize(p->get<std::string>(), true, false);
    } else if (p->is_array()) {
        for (const auto & t : *p) {
            if (!t.is_number_integer()) throw ApiError(400, "'prompt' must be a string or an array of token ids", "prompt");
            const int64_t id = t.get<int64_t>();
            if (id < 0 || id >= model_->n_vocab()) {
                throw ApiError(400, "prompt token " + std::to_string(id) + " is outside the vocabulary (0.." +
                                        std::to_string(model_->n_vocab() - 1) + ")",
                               "prompt");
            }
            prompt.push_back(llama_token(id));
        }
    } else {
        throw ApiError(400, "'prompt' must be a string or an array of token ids", "prompt");
    }
    auto job = std::make_shared<Job>(io_);
    job->is_chat = false;
    job->stream = s.stream;
    job->include_usage = s.include_usage;
    job->id = random_id("cmpl-");
    job->model = model_->id();
    job->out = out;
    job->choices.resize(size_t(s.n));
    std::vector<std::unique_ptr<engine::GenRequest>> reqs;
    for (int32_t i = 0; i < s.n; ++i) {
        auto r = base_request(prompt, s, engine_.n_ctx_seq());
        const uint32_t seed = pick_seed(s, i);
        if (plain_sampling(s)) {
            r->fast = fast_sampler(s, seed);
        } else {
            r->sampler = make_sampler(s, nullptr, false, true, seed);
        }
        reqs.push_back(std::move(r));
    }
    submit(job, std::move(reqs));
}

json OpenAIService::models() const {
    json m = {{"id", model_->id()},
              {"object", "model"},
              {"created", unix_now()},
              {"owned_by", "armada"},
              {"meta", {{"n_vocab", model_->n_vocab()}, {"n_ctx_train", model_->n_ctx_train()},
                        {"n_ctx_seq", engine_.n_ctx_seq()}, {"size", model_->size_bytes()}}}};
    return {{"object", "list"}, {"data", json::array({m})}};
}

}  // namespace armada::api

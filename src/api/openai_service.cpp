#include "api/openai_service.h"

#include "api/errors.h"
#include "common/clock.h"
#include "net/sse.h"
#include "text/utf8.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

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
    for (size_t i = 0; i < n; ++i)
        s += alphabet[rng() % (sizeof(alphabet) - 1)];
    return s;
}

namespace {

std::string sse(const json & j) {
    return armada::net::sse_event({}, dump(j));
}

json tool_call_json(const common_chat_tool_call & c) {
    return {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

json bytes_of(const std::string & piece) {
    json b = json::array();
    for (unsigned char c : piece)
        b.push_back(int(c));
    return b;
}

// A token's text as JSON can carry it: a piece that splits a UTF-8 character shows U+FFFD here,
// and its exact bytes in "bytes".
std::string token_text(const std::string & piece) {
    return text::utf8_sanitize(piece);
}

// One entry of chat's logprobs.content, OpenAI's shape.
json chat_logprob(const engine::TokenLogprob & t) {
    json top = json::array();
    for (const auto & [piece, lp] : t.top)
        top.push_back({{"token", token_text(piece)}, {"logprob", lp}, {"bytes", bytes_of(piece)}});
    return {
        {"token", token_text(t.piece)}, {"logprob", t.logprob}, {"bytes", bytes_of(t.piece)}, {"top_logprobs", top}};
}

// The legacy completions form: parallel lists of tokens, their logprobs, the alternatives and
// each token's offset in the text.
json completion_logprobs(const std::vector<engine::TokenLogprob> & toks, size_t & offset) {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (const auto & t : toks) {
        tokens.push_back(token_text(t.piece));
        lps.push_back(t.logprob);
        json top = json::object();
        for (const auto & [piece, lp] : t.top)
            top[token_text(piece)] = lp;
        tops.push_back(top);
        offsets.push_back(offset);
        offset += t.piece.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
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
        std::vector<engine::TokenLogprob> logprobs;  // every token, for the final answer
        size_t lp_sent = 0;                          // how many went out in stream chunks
        size_t lp_offset = 0;                        // completions' text_offset so far
    };

    bool is_chat = true;
    bool stream = false, include_usage = false;
    bool want_logprobs = false;
    std::shared_ptr<engine::ChatTurn> turn;  // chat only
    const engine::ChatFormat * format = nullptr;
    std::string id, model;
    int64_t created = common::unix_s();
    std::shared_ptr<Responder> out;
    std::vector<Choice> choices;
    net::strand<net::any_io_executor> strand;
    engine::EngineSet * engine = nullptr;
    obs::Registry * metrics = nullptr;

    std::mutex mu;
    std::vector<std::pair<size_t, GenEvent>> events;  // guarded by mu
    bool scheduled = false;                           // guarded by mu
    bool broken = false;                              // building the answer threw (strand only)
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
        for (auto & [i, ev] : batch) {
            if (broken) return;
            try {
                on_event(i, std::move(ev));
            } catch (const std::exception & e) {
                // Building the answer failed (a parser refusing what the model wrote): this
                // request fails, the process and every other request go on.
                broken = true;
                spdlog::error("{}: building the answer failed: {}", id, e.what());
                if (stream) {
                    out->write(sse(json{{"error", {{"message", "internal error"}, {"type", "server_error"}}}}));
                    out->end();
                } else {
                    out->send(500, "application/json", error_body(500, "internal error"));
                }
            }
        }
    }

    common_chat_msg parse(Choice & c, bool partial) {
        common_chat_msg msg;
        if (!is_chat) {
            msg.content = c.text;
            return msg;
        }
        if (partial) {
            // Mid-stream, output that does not parse yet adds nothing; the final parse decides.
            auto m = format->try_parse(*turn, c.text, true);
            if (!m) return c.parsed;
            msg = std::move(*m);
        } else {
            msg = format->parse(*turn, c.text, false);
        }
        msg.set_tool_call_ids(c.tool_ids, [] { return random_id("call_"); });
        return msg;
    }

    void on_event(size_t i, GenEvent && ev) {
        Choice & c = choices[i];
        if (ev.kind == GenEvent::Kind::Text) {
            c.text += ev.text;
            for (auto & t : ev.logprobs)
                c.logprobs.push_back(std::move(t));
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

    //! The logprobs of tokens not yet sent in a chunk, in the route's shape; null when none.
    json pending_logprobs(Choice & c) {
        if (!want_logprobs || c.lp_sent == c.logprobs.size()) return nullptr;
        const std::vector<engine::TokenLogprob> fresh(c.logprobs.begin() + std::ptrdiff_t(c.lp_sent), c.logprobs.end());
        c.lp_sent = c.logprobs.size();
        if (!is_chat) return completion_logprobs(fresh, c.lp_offset);
        json content = json::array();
        for (const auto & t : fresh)
            content.push_back(chat_logprob(t));
        return {{"content", content}, {"refusal", nullptr}};
    }

    void emit_delta(size_t i, json delta) {
        json j = chunk_base();
        if (is_chat && !choices[i].role_sent) {
            // OpenAI's first delta of a choice carries the role.
            choices[i].role_sent = true;
            emit_delta(i, json{{"role", "assistant"}, {"content", ""}});
            if (delta.empty()) return;
        }
        json lp = delta.contains("role") ? json(nullptr) : pending_logprobs(choices[i]);
        if (is_chat) {
            j["choices"] = json::array(
                {{{"index", i}, {"delta", std::move(delta)}, {"logprobs", lp}, {"finish_reason", nullptr}}});
        } else {
            j["choices"] =
                json::array({{{"index", i}, {"text", delta["content"]}, {"logprobs", lp}, {"finish_reason", nullptr}}});
        }
        out->write(sse(j));
    }

    void stream_delta(size_t i, Choice & c, bool partial) {
        common_chat_msg msg = parse(c, partial);
        if (msg.tool_calls.size() < c.parsed.tool_calls.size()) {
            // The final parse drops a call whose arguments were cut off (max_tokens) after its
            // start was streamed. llama.cpp's diff refuses fewer calls; what was streamed stays
            // streamed, and only new text is left to send.
            if (msg.content.size() > c.parsed.content.size() && msg.content.rfind(c.parsed.content, 0) == 0)
                emit_delta(i, json{{"content", msg.content.substr(c.parsed.content.size())}});
            c.parsed = std::move(msg);
            return;
        }
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
        // Tokens whose text added no delta (held back, or inside a tool call) come with the end.
        const json lp = pending_logprobs(c);
        if (is_chat) {
            j["choices"] = json::array(
                {{{"index", i}, {"delta", json::object()}, {"logprobs", lp}, {"finish_reason", finish_reason(c)}}});
        } else {
            j["choices"] =
                json::array({{{"index", i}, {"text", ""}, {"logprobs", lp}, {"finish_reason", finish_reason(c)}}});
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
                metrics
                    ->counter("armada_requests_total", "HTTP requests by route and status",
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
        metrics
            ->counter("armada_requests_total", "HTTP requests by route and status", {{"route", route}, {"code", "200"}})
            .inc();
        if (stream) {
            if (include_usage) {
                json j = chunk_base();
                j["choices"] = json::array();
                j["usage"] = usage();
                out->write(sse(j));
            }
            out->write(armada::net::sse_event({}, "[DONE]"));
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
            const json lp = pending_logprobs(c);
            if (!is_chat) {
                arr.push_back({{"index", i}, {"text", c.text}, {"logprobs", lp}, {"finish_reason", finish_reason(c)}});
                continue;
            }
            c.parsed = parse(c, false);
            json msg = {{"role", "assistant"}};
            msg["content"] =
                c.parsed.content.empty() && !c.parsed.tool_calls.empty() ? json(nullptr) : json(c.parsed.content);
            if (!c.parsed.tool_calls.empty()) {
                json calls = json::array();
                for (const auto & tc : c.parsed.tool_calls)
                    calls.push_back(tool_call_json(tc));
                msg["tool_calls"] = calls;
            }
            if (!c.parsed.reasoning_content.empty()) msg["reasoning_content"] = c.parsed.reasoning_content;
            arr.push_back({{"index", i}, {"message", msg}, {"logprobs", lp}, {"finish_reason", finish_reason(c)}});
        }
        res["choices"] = arr;
        res["usage"] = usage();
        out->send(200, "application/json", dump(res));
    }
};

OpenAIService::OpenAIService(std::shared_ptr<engine::Model> model, engine::EngineSet & engine, obs::Registry & metrics,
                             net::any_io_executor io, RequestLimits limits)
    : model_(std::move(model)),
      engine_(engine),
      metrics_(metrics),
      io_(std::move(io)),
      limits_(limits),
      format_(model_) {
    if (limits_.max_tokens == 0) limits_.max_tokens = engine_.n_ctx_seq();
}

OpenAIService::~OpenAIService() = default;

void OpenAIService::submit(std::shared_ptr<Job> job, std::vector<std::unique_ptr<engine::GenRequest>> reqs,
                           const std::string & account, const std::string & tenant, const std::string & program) {
    job->engine = &engine_;
    job->metrics = &metrics_;
    for (size_t i = 0; i < reqs.size(); ++i) {
        job->choices[i].cancelled = reqs[i]->cancelled;
        reqs[i]->sink = job->sink(i);
        reqs[i]->account = account;
        reqs[i]->tenant = tenant;
        reqs[i]->program = program;
    }
    // All choices or none: a partially accepted request would leave the client waiting.
    for (size_t i = 0; i < reqs.size(); ++i) {
        const auto st = engine_.submit(std::move(reqs[i]));
        if (st != engine::SubmitStatus::Accepted) {
            for (size_t k = 0; k < i; ++k)
                job->choices[k].cancelled->store(true);
            engine_.wake();
            if (st == engine::SubmitStatus::QueueFull) throw at_capacity();
            ApiError e(503, "the server is shutting down", {}, "unavailable");
            e.retry_after_s = 1;
            throw e;
        }
    }
    auto weak = std::weak_ptr<Job>(job);
    job->out->on_close([weak, eng = &engine_] {
        if (auto j = weak.lock()) {
            for (auto & c : j->choices)
                c.cancelled->store(true);
            eng->wake();
        }
    });
    // Runs inline on the connection's strand, so it precedes any chunk the engine produces.
    if (job->stream) job->out->start_stream(200);
}

namespace {
//! The conversation a request names, for the engine's scheduler: OpenAI's prompt_cache_key, else
//! its user, else the X-Armada-Session header; empty when none does (the engine then follows the
//! prompt-cache chain). Scoped to the tenant by the engine; at most 256 bytes are kept.
std::string program_of(const json & body, const std::string & session) {
    for (const char * field : {"prompt_cache_key", "user"}) {
        auto it = body.find(field);
        if (it != body.end() && it->is_string() && !it->get_ref<const std::string &>().empty())
            return std::string(field) + ":" + it->get<std::string>().substr(0, 256);
    }
    return session.empty() ? std::string() : "session-header:" + session.substr(0, 256);
}
}  // namespace

void OpenAIService::chat(const json & body, const std::string & account, const std::string & tenant,
                         std::shared_ptr<Responder> out, const std::string & session) {
    ChatSpec spec = parse_chat(body, model_->n_vocab(), limits_);
    if (!engine_.has_room(spec.sampling.n)) throw at_capacity();
    auto turn = std::make_shared<engine::ChatTurn>(
        format_.render(spec.messages, spec.tools, spec.tool_choice, spec.parallel_tool_calls));
    spdlog::debug("chat: format {} grammar {} bytes lazy {} prompt {} tokens",
                  common_chat_format_name(turn->params.format), turn->params.grammar.size(), turn->params.grammar_lazy,
                  turn->prompt.size());

    auto job = std::make_shared<Job>(io_);
    job->is_chat = true;
    job->want_logprobs = spec.sampling.logprobs >= 0;
    job->stream = spec.sampling.stream;
    job->include_usage = spec.sampling.include_usage;
    job->id = random_id("chatcmpl-");
    job->model = model_->id();
    job->out = out;
    job->turn = turn;
    job->format = &format_;
    job->choices.resize(size_t(spec.sampling.n));

    std::vector<std::unique_ptr<engine::GenRequest>> reqs;
    for (int32_t i = 0; i < spec.sampling.n; ++i) {
        reqs.push_back(
            format_.request(*turn, spec.sampling, engine_.n_ctx_seq(), engine::choice_seed(spec.sampling, i)));
    }
    submit(job, std::move(reqs), account, tenant, program_of(body, session));
}

void OpenAIService::completion(const json & body, const std::string & account, const std::string & tenant,
                               std::shared_ptr<Responder> out, const std::string & session) {
    SamplingSpec s = parse_sampling(body, model_->n_vocab(), limits_);
    if (!engine_.has_room(s.n)) throw at_capacity();
    engine::Tokens prompt;
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
    const json * p = &*it;
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
    if (p->is_string()) {
        prompt = model_->tokenize(p->get<std::string>(), true, false);
    } else if (p->is_array()) {
        for (const auto & t : *p) {
            if (!t.is_number_integer())
                throw ApiError(400, "'prompt' must be a string or an array of token ids", "prompt");
            const int64_t id = t.get<int64_t>();
            if (id < 0 || id >= model_->n_vocab()) {
                throw ApiError(400,
                               "prompt token " + std::to_string(id) + " is outside the vocabulary (0.." +
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
    job->want_logprobs = s.logprobs >= 0;
    job->stream = s.stream;
    job->include_usage = s.include_usage;
    job->id = random_id("cmpl-");
    job->model = model_->id();
    job->out = out;
    job->choices.resize(size_t(s.n));
    std::vector<std::unique_ptr<engine::GenRequest>> reqs;
    for (int32_t i = 0; i < s.n; ++i) {
        reqs.push_back(engine::plain_request(*model_, prompt, s, engine_.n_ctx_seq(), engine::choice_seed(s, i)));
    }
    submit(job, std::move(reqs), account, tenant, program_of(body, session));
}

json OpenAIService::models() const {
    json m = {{"id", model_->id()},
              {"object", "model"},
              {"created", common::unix_s()},
              {"owned_by", "armada"},
              {"meta",
               {{"n_vocab", model_->n_vocab()},
                {"n_ctx_train", model_->n_ctx_train()},
                {"n_ctx_seq", engine_.n_ctx_seq()},
                {"size", model_->size_bytes()}}}};
    return {{"object", "list"}, {"data", json::array({m})}};
}

}  // namespace armada::api

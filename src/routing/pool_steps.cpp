#include "routing/pool_steps.h"

#include "common/json_fields.h"
#include "common/tenant.h"
#include "engine/tool_grammar.h"
#include "routing/choice.h"
#include "routing/facts.h"
#include "routing/upstream.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <set>

namespace armada::routing {

using common::json_text;
using nlohmann::json;

namespace {

//! A schema whose instances are the calls of one of `tools`: {"name": N, "arguments": {…}}.
json call_schema(const std::vector<common_chat_tool> & tools) {
    json any = json::array();
    for (const auto & t : tools) {
        json params = json::parse(t.parameters.empty() ? "{}" : t.parameters, nullptr, false);
        if (!params.is_object()) params = json{{"type", "object"}};
        any.push_back({{"type", "object"},
                       {"properties", {{"name", {{"type", "string"}, {"enum", {t.name}}}}, {"arguments", params}}},
                       {"required", {"name", "arguments"}},
                       {"additionalProperties", false}});
    }
    return any.size() == 1 ? any[0] : json{{"anyOf", any}};
}

}  // namespace

json pool_step_body(const PoolStep & step, const std::string & model, GrammarDialect d) {
    const auto & s = step.sampling;
    const auto & t = *step.turn;
    json body = {{"model", model},
                 {"prompt", t.prompt},
                 {"temperature", s.temperature},
                 {"top_p", s.top_p},
                 {"seed", step.seed},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (s.max_tokens > 0) body["max_tokens"] = s.max_tokens;
    json stop = json::array();
    for (const auto & x : s.stop)
        stop.push_back(x);
    for (const auto & x : t.params.additional_stops)
        stop.push_back(x);
    if (!stop.empty()) body["stop"] = stop;
    const bool llama = d == GrammarDialect::llama;
    if (llama) {
        body["top_k"] = s.top_k;
        body["min_p"] = s.min_p;
        body["cache_prompt"] = true;
    }
    if (!t.tools_on || t.params.grammar.empty()) return body;
    if (llama) {
        body["grammar"] = engine::constrain_tool_grammar(t.params.grammar, t.require_call, t.parallel);
        body["grammar_type"] = "tool_calls";
        body["grammar_lazy"] = t.params.grammar_lazy;
        json triggers = json::array();
        for (const auto & g : t.params.grammar_triggers) {
            json j = {{"type", int(g.type)}, {"value", g.value}};
            if (g.type == COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN) j["token"] = g.token;
            triggers.push_back(j);
        }
        body["grammar_triggers"] = triggers;
        body["preserved_tokens"] = t.params.preserved_tokens;
        body["generation_prompt"] = t.params.generation_prompt;
    } else if (t.require_call && !step.tools.empty()) {
        body["response_format"] = {
            {"type", "json_schema"},
            {"json_schema", {{"name", "tool_call"}, {"strict", true}, {"schema", call_schema(step.tools)}}}};
    }
    return body;
}

std::optional<common_chat_msg> call_from_schema_reply(const std::string & text) {
    const json j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    const auto name = j.find("name");
    const auto args = j.find("arguments");
    if (name == j.end() || !name->is_string() || args == j.end() || !args->is_object()) return std::nullopt;
    common_chat_msg msg;
    msg.role = "assistant";
    common_chat_tool_call c;
    c.name = name->get<std::string>();
    c.arguments = json_text(*args);
    msg.tool_calls.push_back(c);
    return msg;
}

void CompletionStream::feed(std::string_view bytes, const std::function<void(const std::string &)> & on_text) {
    if (!sse_.feed(bytes, [&](net::SseEvent & ev) { return event(ev.data, on_text); }) && sse_.failed())
        error_ = "the upstream sent an event too long to read";
}

void CompletionStream::end(const std::function<void(const std::string &)> & on_text) {
    if (!sse_.finish([&](net::SseEvent & ev) { return event(ev.data, on_text); }) && sse_.failed())
        error_ = "the upstream sent an event too long to read";
}

bool CompletionStream::event(const std::string & data, const std::function<void(const std::string &)> & on_text) {
    // Each `data:` line is a chunk of its own, as upstreams that put several in one event mean it.
    for (const std::string_view line : net::data_lines(data))
        chunk(std::string(line), on_text);
    return true;
}

void CompletionStream::chunk(const std::string & data, const std::function<void(const std::string &)> & on_text) {
    if (data == "[DONE]") {
        done_ = true;
        return;
    }
    const json j = json::parse(data, nullptr, false);
    if (!j.is_object()) return;
    if (const auto e = j.find("error"); e != j.end()) {
        error_ = common::string_field(*e, "message").value_or(json_text(*e));
        return;
    }
    if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
        if (auto n = common::int_field(*u, "prompt_tokens")) prompt_ = int32_t(*n);
        if (auto n = common::int_field(*u, "completion_tokens")) completion_ = int32_t(*n);
    }
    const auto ch = j.find("choices");
    if (ch == j.end() || !ch->is_array() || ch->empty() || !(*ch)[0].is_object()) return;
    const json & c = (*ch)[0];
    if (const auto text = c.find("text");
        text != c.end() && text->is_string() && !text->get_ref<const std::string &>().empty())
        on_text(text->get<std::string>());
    if (const auto f = c.find("finish_reason"); f != c.end() && f->is_string()) {
        finish_ = f->get<std::string>();
        done_ = true;
    }
}

PoolStepRunner::PoolStepRunner(RoutingConfig cfg, PoolSet & pools, std::function<int32_t(const std::string &)> count)
    : cfg_(std::make_shared<const RoutingConfig>(std::move(cfg))), pools_(pools), count_(std::move(count)) {
    watcher_ = std::thread([this] { watch(); });
}

PoolStepRunner::~PoolStepRunner() {
    stop();
}

void PoolStepRunner::stop() {
    {
        std::unique_lock lk(mu_);
        stop_ = true;
        for (auto & f : flights_)
            f.token->cancel();
        cv_.notify_all();
        cv_.wait(lk, [&] { return running_ == 0; });
    }
    if (watcher_.joinable()) watcher_.join();
}

std::string PoolStepRunner::route(const StepFacts & s) const {
    std::shared_ptr<const RoutingConfig> cfg;
    {
        std::lock_guard lk(cfg_mu_);
        cfg = cfg_;
    }
    Asked a;
    // The config names tenants as the operator does; a session's owner is the API's "t:NAME".
    a.tenant = common::tenant_name(s.tenant);
    a.model = s.model;
    a.prompt_tokens = s.prompt_tokens;
    a.max_tokens = s.max_tokens;
    a.long_step = s.long_step;
    std::string unused;  // a step asks for no latency class: its tenant's own always holds
    const auto f = route_facts(*cfg, a, unused);
    if (!f) return {};
    TargetContexts c;
    for (const auto & name : pools_.names())
        c.pools.emplace_back(name, pools_.context(name));
    return plan_step(cfg->routes, *f, c, s.prompt_tokens + std::max<int64_t>(s.max_tokens, 1), s.node_context);
}

std::string PoolStepRunner::reload(RoutingConfig cfg) {
    if (auto e = pools_.reload(cfg.pools); !e.empty()) return e;
    std::lock_guard lk(cfg_mu_);
    cfg_ = std::make_shared<const RoutingConfig>(std::move(cfg));
    return {};
}

int64_t PoolStepRunner::context(const std::string & pool) const {
    return pools_.context(pool);
}

void PoolStepRunner::run(PoolStep step, std::function<void(std::string)> on_text,
                         std::function<void(PoolStepResult)> done) {
    {
        std::lock_guard lk(mu_);
        if (stop_) {
            PoolStepResult r;
            r.error = "the node is stopping";
            done(std::move(r));
            return;
        }
        ++running_;
    }
    std::thread([this, step = std::move(step), on_text = std::move(on_text), done = std::move(done)] {
        work(step, on_text, done);
        std::lock_guard lk(mu_);
        --running_;
        cv_.notify_all();
    }).detach();
}

void PoolStepRunner::watch() {
    std::unique_lock lk(mu_);
    while (!stop_) {
        cv_.wait_for(lk, std::chrono::milliseconds(50));
        for (auto & f : flights_) {
            if (f.cancelled && f.cancelled->load()) f.token->cancel();
        }
    }
}

void PoolStepRunner::work(const PoolStep & step, const std::function<void(std::string)> & on_text,
                          const std::function<void(PoolStepResult)> & done) {
    PoolStepResult r;
    std::set<std::string> avoid;
    const auto t0 = std::chrono::steady_clock::now();
    // Every upstream of the pool once at most (a bound as well, should the pool be reloaded meanwhile).
    for (int attempt = 0; attempt < 64; ++attempt) {
        if (step.cancelled && step.cancelled->load()) {
            r.cancelled = true;
            return done(std::move(r));
        }
        PoolSet::Unavailable why = PoolSet::Unavailable::none;
        const auto lease = pools_.acquire(step.pool, avoid, false, why);
        if (!lease) {
            if (r.error.empty() || why == PoolSet::Unavailable::full) {
                r.error =
                    why == PoolSet::Unavailable::full ? "every upstream is at its max_in_flight" : "no upstream is up";
            }
            break;
        }
        avoid.insert(lease->url);
        json body = pool_step_body(step, lease->model, lease->grammar);
        if (lease->cache_salt) body["cache_salt"] = tenant_cache_salt(step.tenant);
        HeaderList headers{{"content-type", "application/json"}, {"accept", "text/event-stream"}};
        if (!lease->key.empty()) headers.emplace_back("authorization", "Bearer " + lease->key);
        if (!step.traceparent.empty()) headers.emplace_back("traceparent", step.traceparent);
        auto token = std::make_shared<CancelToken>();
        std::list<Flight>::iterator flight;
        {
            std::lock_guard lk(mu_);
            flight = flights_.insert(flights_.end(), Flight{step.cancelled, token});
            if (stop_) token->cancel();
        }
        CompletionStream stream;
        std::string text;
        double head_s = 0, ttft_s = 0;
        // A step that must call a tool through `response_format` streams JSON, not the model's
        // own call format: nothing of it is shown before it is whole.
        const bool schema_call = lease->grammar == GrammarDialect::json_schema && step.turn->tools_on &&
                                 step.turn->require_call && !step.tools.empty();
        const auto on_piece = [&](const std::string & piece) {
            if (text.empty()) ttft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            text += piece;
            if (!schema_call) on_text(piece);
        };
        const auto started = std::chrono::steady_clock::now();
        const auto reply = forward(
            lease->url, "POST", "/v1/completions", headers, json_text(body), lease->timeout_ms,
            [&](const UpstreamReply & h) {
                head_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
                return h.status == 200;
            },
            [&](std::string_view chunk) {
                stream.feed(chunk, on_piece);
                return !(step.cancelled && step.cancelled->load());
            },
            token, lease->timeout_ms);
        stream.end(on_piece);
        {
            std::lock_guard lk(mu_);
            flights_.erase(flight);
        }
        const bool cancelled = token->cancelled() || (step.cancelled && step.cancelled->load());
        if (cancelled) {
            pools_.release(*lease, PoolOutcome::cancelled, head_s);
            r.cancelled = true;
            return done(std::move(r));
        }
        if (reply.status == 200 && stream.done() && stream.error().empty()) {
            pools_.release(*lease, PoolOutcome::ok, head_s);
            r.ran = true;
            r.upstream = lease->model;
            r.finish = stream.finish() == "length" ? engine::FinishReason::Length : engine::FinishReason::Stop;
            r.n_prompt = stream.prompt_tokens() >= 0 ? stream.prompt_tokens() : int32_t(step.turn->prompt.size());
            r.n_generated = stream.completion_tokens() >= 0 ? stream.completion_tokens() : count_ ? count_(text) : 0;
            r.ttft_s = ttft_s;
            if (schema_call) {
                r.call = call_from_schema_reply(text);
                if (r.call) on_text(text);
            }
            r.text = std::move(text);
            return done(std::move(r));
        }
        // 401, 403 and 404 say the upstream's key or model name is wrong: its fault, as a 5xx.
        // Other 4xx are about the request: another upstream would say the same.
        const bool misconfigured = reply.status == 401 || reply.status == 403 || reply.status == 404;
        const bool request_fault = reply.status >= 400 && reply.status < 500 && reply.status != 429 && !misconfigured;
        PoolOutcome outcome = PoolOutcome::failed;
        if (reply.status == 429) {
            outcome = PoolOutcome::busy;
        } else if (request_fault) {
            outcome = PoolOutcome::ok;
        }
        pools_.release(*lease, outcome, head_s);
        r.error = reply.status == 0         ? "no answer: " + reply.error
                  : reply.status != 200     ? "HTTP " + std::to_string(reply.status) + ": " + reply.body.substr(0, 300)
                  : !stream.error().empty() ? "the upstream's stream reported: " + stream.error()
                                            : "the stream ended before the answer did" +
                                                  (reply.error.empty() ? std::string() : ": " + reply.error);
        spdlog::warn("pool '{}': upstream {} failed a step: {}", step.pool, lease->model, r.error);
        if (!text.empty() && !schema_call) on_text({});  // what it streamed is void
        if (request_fault) break;
    }
    done(std::move(r));
}

}  // namespace armada::routing

// The step runner: builds a model step's prompt, runs it on this node's engine or a GPU pool,
// and turns its reply into tool calls or an answer. Also the turn's trace spans.

#include "agent/step_runner.h"

#include "agent/session.h"

#include "agent/transcript_json.h"
#include "common/json_fields.h"
#include "obs/log.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <nlohmann/json.hpp>

#include <limits>
#include <random>

namespace armada::agent {

using json = nlohmann::json;
namespace net = boost::asio;

StepRunner::StepRunner(Host & host, engine::ChatFormat & format, GenerationPort & engine, obs::Registry & metrics,
                       const Clock & clock, net::any_io_executor io, std::shared_ptr<std::atomic<bool>> alive,
                       Options opt)
    : host_(host),
      format_(format),
      engine_(engine),
      metrics_(metrics),
      clock_(clock),
      io_(std::move(io)),
      alive_(std::move(alive)),
      opt_(std::move(opt)) {}

void StepRunner::hand_over(const net::any_io_executor & strand, std::function<void()> fn) {
    net::post(strand, [this, alive = alive_, fn = std::move(fn)] {
        if (*alive) host_.locked(fn);
    });
}

void StepRunner::forget_agent(const std::string & tenant, const std::string & id) {
    const std::string key = tenant + "|" + id + "|";
    std::erase_if(prefixes_, [&](const auto & kv) { return kv.first.rfind(key, 0) == 0; });
}

int32_t StepRunner::shared_prefix(const Session & s, const AgentSpec & a, const std::vector<common_chat_tool> & tools,
                                  common_chat_tool_choice choice) {
    // The agent's instructions and tool schemas render the same way for every session: find
    // those tokens once per agent and tool_choice, by rendering two different user messages and
    // keeping what they share.
    const std::string ck =
        (a.from_operator ? std::string() : a.tenant) + "|" + a.id + "|" + std::to_string(int(choice));
    auto it = prefixes_.find(ck);
    if (it == prefixes_.end()) {
        engine::Tokens common;
        try {
            auto with_user = [&](const char * text) {
                std::vector<common_chat_msg> m;
                if (auto sys = system_message(a)) m.push_back(*sys);
                common_chat_msg u;
                u.role = "user";
                u.content = text;
                m.push_back(u);
                return format_.render(m, tools, choice, a.parallel_tool_calls).prompt;
            };
            common = common_prefix(with_user("Alpha"), with_user("Omega"));
        } catch (const std::exception &) {
            common.clear();
        }
        it = prefixes_.emplace(ck, std::move(common)).first;
    }
    // The engine's prompt cache keys it by content and tenant (req->tenant): never shared across
    // tenants, since a hit would tell one tenant, by timing, what another sent.
    return s.gen.turn ? shared_prefix_length(it->second, s.gen.turn->prompt) : 0;
}

void StepRunner::begin_turn(Session & s) {
    if (s.trace.turn) return;
    const std::string agent = s.agent ? s.agent->id : s.agent_id;
    s.trace.turn = obs::Span::start("invoke_agent " + agent, obs::SpanKind::internal, s.trace.parent);
    s.trace.last = obs::tracer()->enabled() ? std::optional(s.trace.turn->context()) : s.trace.parent;
    s.trace.parent.reset();
    obs::Span & sp = *s.trace.turn;
    sp.set("gen_ai.operation.name", std::string("invoke_agent"));
    sp.set("gen_ai.agent.id", agent);
    sp.set("gen_ai.agent.name", agent);
    sp.set("gen_ai.conversation.id", s.id);
    sp.set("armada.tenant", s.owner);
    if (!opt_.node.empty()) sp.set("armada.node", opt_.node);
    if (s.place.epoch > 0) sp.set("armada.epoch", s.place.epoch);
    s.trace.turn_prompt_tokens = s.transcript.prompt_tokens;
    s.trace.turn_completion_tokens = s.transcript.completion_tokens;
}

void StepRunner::end_turn(Session & s, const std::string & error) {
    auto tracer = obs::tracer();
    const std::string why = error.empty() ? std::string("the turn ended") : error;
    if (s.trace.step) {
        s.trace.step->fail(why);
        tracer->end(std::move(*s.trace.step));
        s.trace.step.reset();
    }
    for (auto & [key, sp] : s.trace.tools) {
        sp.fail(why);
        tracer->end(std::move(sp));
    }
    s.trace.tools.clear();
    if (!s.trace.turn) return;
    spdlog::debug("session {}: turn ended ({}){}", s.id, state_name(s.state), error.empty() ? "" : ": " + error);
    obs::Span & sp = *s.trace.turn;
    sp.set("gen_ai.usage.input_tokens", s.transcript.prompt_tokens - s.trace.turn_prompt_tokens);
    sp.set("gen_ai.usage.output_tokens", s.transcript.completion_tokens - s.trace.turn_completion_tokens);
    sp.set("armada.state", std::string(state_name(s.state)));
    if (!error.empty()) sp.fail(error);
    tracer->end(std::move(sp));
    s.trace.turn.reset();
}

void StepRunner::run(Session & s) {
    // Draining: the session is checkpointed between steps and goes on at the next start (or on
    // the node it moves to). Offered to move: it waits for the move, or for `stay_unmoved`.
    if (!host_.may_call(s)) return;
    begin_turn(s);
    if (!s.agent) return host_.fail(s, SessionEvent::Error, "its agent '" + s.agent_id + "' no longer exists");
    const AgentSpec & a = *s.agent;
    if (s.transcript.model_steps >= a.limits.max_steps) {
        return host_.fail(s, SessionEvent::LimitReached,
                          "max_steps (" + std::to_string(a.limits.max_steps) + ") reached");
    }
    if (a.limits.token_budget > 0 &&
        s.transcript.prompt_tokens + s.transcript.completion_tokens >= a.limits.token_budget) {
        return host_.fail(s, SessionEvent::LimitReached,
                          "token budget (" + std::to_string(a.limits.token_budget) + ") spent");
    }
    if (a.limits.deadline_s > 0 && clock_.now_ms() - s.created_ms > int64_t(a.limits.deadline_s) * 1000) {
        return host_.fail(s, SessionEvent::LimitReached,
                          "deadline (" + std::to_string(a.limits.deadline_s) + " s) passed");
    }
    // The prompt (agent/prompt_builder.h): instructions, then the transcript with the oldest
    // `dropped` tool outputs replaced by a note (compaction; the stored transcript keeps them).
    std::vector<common_chat_tool> tools = prompt_tools(a);
    const common_chat_tool_choice choice = step_tool_choice(a, s.transcript.model_steps);

    // Per-session memory cap: the context of one sequence (or of the pool the step goes to), and
    // the agent's own token/byte caps.
    const uint64_t bpt = engine_.kv_bytes_per_token();
    int64_t cap = memory_cap(a.limits, engine_.n_ctx_seq(), bpt);

    std::unique_ptr<engine::GenRequest> req;
    std::string pool;
    engine::SamplingOptions so = a.sampling;
    so.max_tokens = a.limits.max_tokens_per_step;
    so.seed =
        a.sampling.seed ? std::optional<uint32_t>(*a.sampling.seed + uint32_t(s.transcript.model_steps)) : std::nullopt;
    try {
        s.gen.turn = std::make_shared<engine::ChatTurn>(
            format_.render(prompt_messages(a, s.transcript.messages, s.transcript.dropped_tools), tools, choice,
                           a.parallel_tool_calls));
        if (opt_.pool && !s.gen.pool_local) {
            // A step reading the output of a tool the agent marks (long_after_tools) is long.
            const bool long_step = reads_long_tool_output(a, s.transcript.messages);
            pool = opt_.pool->route({int64_t(s.gen.turn->prompt.size()), so.max_tokens, long_step, s.owner, a.model,
                                     int64_t(engine_.n_ctx_seq())});
            if (!pool.empty()) {
                const int64_t ctx = opt_.pool->context(pool);
                cap = memory_cap(a.limits, ctx > 0 ? ctx - so.max_tokens : std::numeric_limits<int32_t>::max(), bpt);
            }
        }
        if (int64_t(s.gen.turn->prompt.size()) > cap && a.limits.keep_tool_outputs >= 0) {
            const int32_t want = tool_outputs_to_drop(s.transcript.messages, a.limits.keep_tool_outputs);
            if (want > s.transcript.dropped_tools) {
                const size_t before = s.gen.turn->prompt.size();
                s.transcript.dropped_tools = want;
                s.gen.turn = std::make_shared<engine::ChatTurn>(
                    format_.render(prompt_messages(a, s.transcript.messages, s.transcript.dropped_tools), tools, choice,
                                   a.parallel_tool_calls));
                ++s.transcript.compactions;
                metrics_.counter("armada_session_compactions_total", "Prompts compacted at a session's memory cap")
                    .inc();
                s.stream.transient("compaction",
                                   common::json_text(json{{"dropped_tool_outputs", s.transcript.dropped_tools},
                                                          {"prompt_tokens_before", before},
                                                          {"prompt_tokens_after", s.gen.turn->prompt.size()},
                                                          {"cap_tokens", cap}}));
            }
        }
        if (int64_t(s.gen.turn->prompt.size()) > cap) {
            std::string why = "session memory cap reached: the next step's prompt has " +
                              std::to_string(s.gen.turn->prompt.size()) + " tokens (" +
                              std::to_string(uint64_t(s.gen.turn->prompt.size()) * bpt) +
                              " bytes of KV) but the cap is " + std::to_string(cap) + " tokens";
            why += a.limits.keep_tool_outputs >= 0
                       ? " even with tool outputs older than the newest " + std::to_string(a.limits.keep_tool_outputs) +
                             " removed"
                       : "; set limits.keep_tool_outputs to compact old tool outputs instead of failing";
            return host_.fail(s, SessionEvent::LimitReached, why);
        }
        if (!s.trace.step) {
            const std::string model = !a.model.empty() ? a.model : opt_.model;
            s.trace.step =
                obs::Span::start("chat " + model, pool.empty() ? obs::SpanKind::internal : obs::SpanKind::client,
                                 s.trace.turn ? std::optional(s.trace.turn->context()) : std::nullopt);
            s.trace.step->set("gen_ai.operation.name", std::string("chat"));
            s.trace.step->set("gen_ai.request.model", model);
            s.trace.step->set("gen_ai.conversation.id", s.id);
            s.trace.step->set("gen_ai.request.max_tokens", int64_t(so.max_tokens));
            s.trace.step->set("armada.step", int64_t(s.transcript.model_steps + 1));
            if (!opt_.node.empty()) s.trace.step->set("armada.node", opt_.node);
        }
        if (!pool.empty()) return delegate(s, pool, std::move(tools), so);
        req = format_.request(*s.gen.turn, so, engine_.n_ctx_seq(), engine::choice_seed(so, 0));
    } catch (const std::exception & e) {
        return host_.fail(s, SessionEvent::Error, std::string("cannot run the model step: ") + e.what());
    }
    req->session = s.id;
    req->account = s.owner;
    req->tenant = s.owner;
    req->prefix_len = shared_prefix(s, a, tools, choice);
    const uint64_t gen = ++s.gen.id;
    s.gen.text.clear();
    s.gen.cancel = req->cancelled;
    if (s.gen.started_ms == 0) s.gen.started_ms = clock_.now_ms();  // a retry keeps the first try's time
    // The engine thread hands events over by posting. They go through one strand per step: on
    // the plain I/O pool, two pieces of text (or the last piece and Done) could run on two
    // threads in either order, and the step's text would be scrambled.
    req->sink = [this, alive = alive_, id = s.id, gen,
                 strand = net::any_io_executor(net::make_strand(io_))](engine::GenEvent && ev) {
        if (!*alive) return;
        if (ev.kind == engine::GenEvent::Kind::Text) {
            hand_over(strand, [this, id, gen, t = std::move(ev.text)]() mutable { on_text(id, gen, std::move(t)); });
        } else {
            hand_over(strand, [this, id, gen, ev = std::move(ev)]() mutable { on_done(id, gen, std::move(ev)); });
        }
    };
    const auto st = engine_.submit(std::move(req));
    if (st == engine::SubmitStatus::QueueFull) {
        // The engine is full: the step waits and tries again; the session keeps its place.
        s.gen.cancel.reset();
        host_.later(200, [this, id = s.id, gen] {
            Session * again = host_.session(id);
            if (again && again->gen.id == gen && again->state == SessionState::Running) run(*again);
        });
    } else if (st == engine::SubmitStatus::Stopped) {
        s.gen.cancel.reset();
    }
}

void StepRunner::delegate(Session & s, const std::string & pool, std::vector<common_chat_tool> tools,
                          const engine::SamplingOptions & so) {
    const uint64_t gen = ++s.gen.id;
    s.gen.text.clear();
    s.gen.cancel = std::make_shared<std::atomic<bool>>(false);
    s.gen.pool = pool;
    if (s.gen.started_ms == 0) s.gen.started_ms = clock_.now_ms();
    // While the pool works the session waits as it does on a tool: its KV leaves the sequences.
    engine_.release(s.id, false);
    metrics_.counter("armada_session_pool_steps_total", "Agent steps sent to a GPU pool", {{"pool", pool}}).inc();
    s.stream.transient("delegated",
                       common::json_text(json{{"pool", pool}, {"prompt_tokens", s.gen.turn->prompt.size()}}));
    PoolStep step;
    step.pool = pool;
    step.turn = s.gen.turn;
    step.tools = std::move(tools);
    step.sampling = so;
    step.seed = engine::choice_seed(so, 0);
    step.tenant = s.owner;
    if (s.trace.step) step.traceparent = s.trace.step->context().traceparent();
    step.cancelled = s.gen.cancel;
    auto strand = net::any_io_executor(net::make_strand(io_));
    opt_.pool->run(
        std::move(step),
        [this, alive = alive_, id = s.id, gen, strand](std::string text) {
            if (*alive)
                hand_over(strand,
                          [this, id, gen, t = std::move(text)]() mutable { on_text(id, gen, std::move(t), true); });
        },
        [this, alive = alive_, id = s.id, gen, strand](PoolStepResult r) {
            if (*alive)
                hand_over(strand, [this, id, gen, r = std::move(r)]() mutable { on_pool_done(id, gen, std::move(r)); });
        });
}

Session * StepRunner::running(const std::string & id, uint64_t gen) {
    Session * s = host_.session(id);
    if (!s || s->gen.id != gen || s->state != SessionState::Running) return nullptr;
    return s;
}

void StepRunner::on_pool_done(const std::string & id, uint64_t gen, PoolStepResult r) {
    Session * step = running(id, gen);
    if (!step) return;
    Session & s = *step;
    const obs::LogScope log_scope(s.id, s.trace.context());
    s.gen.cancel.reset();
    if (r.cancelled) return;
    if (!r.ran) {
        // The pool could not take it: the step runs here if it fits (or can be compacted to fit:
        // `run` then applies the node's cap), else waits for the pool.
        const bool compacts = s.agent && s.agent->limits.keep_tool_outputs >= 0;
        const bool fits = compacts || int64_t(s.gen.turn->prompt.size()) < int64_t(engine_.n_ctx_seq()) - 1;
        metrics_
            .counter("armada_session_pool_fallbacks_total", "Pool steps that the pool could not run",
                     {{"pool", s.gen.pool}, {"to", fits ? "cpu" : "retry"}})
            .inc();
        spdlog::warn("session {}: pool '{}' did not run the step ({}); {}", s.id, s.gen.pool, r.error,
                     fits ? "running it on this node" : "the prompt does not fit this node, trying the pool again");
        s.stream.transient("pool_fallback",
                           common::json_text(json{{"pool", s.gen.pool}, {"to", fits ? "cpu" : "retry"}}));
        if (fits) {
            s.gen.pool_local = true;
            s.gen.pool_fallback = s.gen.pool + "-unavailable";
            return run(s);
        }
        if (++s.gen.pool_waits > 3) {
            return host_.fail(s, SessionEvent::Error,
                              "pool '" + s.gen.pool + "' is unavailable and the step's prompt (" +
                                  std::to_string(s.gen.turn->prompt.size()) +
                                  " tokens) does not fit this node's context (" + std::to_string(engine_.n_ctx_seq()) +
                                  ")");
        }
        s.gen.cancel = std::make_shared<std::atomic<bool>>(false);  // busy while it waits
        host_.later(1000 * s.gen.pool_waits, [this, id = s.id, gen] {
            Session * again = host_.session(id);
            if (!again || again->gen.id != gen) return;
            again->gen.cancel.reset();
            if (again->state == SessionState::Running) run(*again);
        });
        return;
    }
    s.gen.text = std::move(r.text);
    engine::GenEvent ev;
    ev.kind = engine::GenEvent::Kind::Done;
    ev.finish = r.finish;
    ev.n_prompt = r.n_prompt;
    ev.n_generated = r.n_generated;
    ev.ttft_s = r.ttft_s;
    finish(s, ev, s.gen.pool, r.upstream, std::move(r.call));
}

void StepRunner::on_text(const std::string & id, uint64_t gen, std::string text, bool from_pool) {
    Session * found = host_.session(id);
    if (!found || found->gen.id != gen) return;
    Session & s = *found;
    if (text.empty() && from_pool) {
        // A pool's upstream failed midway: the step starts again, and its tokens so far are void.
        s.gen.text.clear();
        s.stream.transient("retract",
                           common::json_text(json{{"reason", "the upstream failed midway; the step starts again"}}));
        return;
    }
    s.gen.text += text;
    s.stream.transient("token", common::json_text(json{{"text", text}}));
}

void StepRunner::on_done(const std::string & id, uint64_t gen, engine::GenEvent ev) {
    Session * step = running(id, gen);
    if (!step) return;
    Session & s = *step;
    const obs::LogScope log_scope(s.id, s.trace.context());
    s.gen.cancel.reset();
    if (ev.finish == engine::FinishReason::Cancelled) return;
    thread_local std::mt19937 test_rng(std::random_device{}());
    if (opt_.test_step_errors > 0 && ev.finish != engine::FinishReason::Error &&
        std::uniform_real_distribution<double>(0, 1)(test_rng) < opt_.test_step_errors) {
        ev.finish = engine::FinishReason::Error;
        ev.error = "injected by --test-step-errors";
    }
    if (ev.finish == engine::FinishReason::Error) {
        steps_++;  // counted, timed with its retry (which keeps the first try's start)
        errors_++;
        if (++s.gen.engine_retries > 2) return host_.fail(s, SessionEvent::Error, "the model failed: " + ev.error);
        return run(s);
    }
    finish(s, ev, "cpu", {}, std::nullopt);
}

void StepRunner::finish(Session & s, const engine::GenEvent & ev, const std::string & where,
                        const std::string & upstream, std::optional<common_chat_msg> call) {
    // A copy: `where` may be the session's `step_pool`, which is cleared below.
    const std::string ran_on = where;  // NOLINT(performance-unnecessary-copy-initialization)
    common_chat_msg msg = call ? std::move(*call) : format_.parse(*s.gen.turn, s.gen.text, false);
    // A call cut off by max_tokens has arguments that are not JSON: it is not a call. A step that
    // had to call a tool and produced no whole call is run again (twice at most).
    std::erase_if(msg.tool_calls, [](const common_chat_tool_call & c) {
        const json args = json::parse(c.arguments, nullptr, false);
        return !args.is_object();
    });
    if (msg.tool_calls.empty() && s.gen.turn->require_call) {
        spdlog::warn("session {}: a step that must call a tool produced no whole call ({}, {} tokens): {}", s.id,
                     engine::finish_reason_name(ev.finish), ev.n_generated, s.gen.text.substr(0, 300));
        if (++s.gen.engine_retries > 2) {
            return host_.fail(s, SessionEvent::Error,
                              "the model produced no complete tool call in a step that requires one");
        }
        return run(s);
    }
    s.gen.engine_retries = 0;
    const int32_t step = ++s.transcript.model_steps;
    s.transcript.prompt_tokens += ev.n_prompt;
    if (opt_.on_tokens) opt_.on_tokens(s.owner, int64_t(ev.n_prompt) + ev.n_generated);
    s.transcript.completion_tokens += ev.n_generated;
    if (ran_on == "cpu") {
        s.transcript.kv_history.push_back({step, ev.kv_tokens, uint64_t(ev.kv_tokens) * engine_.kv_bytes_per_token()});
    }
    metrics_.counter("armada_session_steps_total", "Model steps taken by agent sessions").inc();

    json out = {{"step", step},
                {"content", msg.content},
                {"tool_calls", json::array()},
                {"prompt_tokens", ev.n_prompt},
                {"completion_tokens", ev.n_generated},
                {"finish_reason", engine::finish_reason_name(ev.finish)},
                {"cached_tokens", ev.n_cached},
                {"ttft_ms", ev.ttft_s * 1000},
                {"started_ms", s.gen.started_ms},
                {"kv_tokens", ev.kv_tokens},
                {"ran_on", ran_on}};
    if (!upstream.empty()) out["upstream"] = upstream;
    if (ran_on == "cpu" && !s.gen.pool_fallback.empty()) out["pool_fallback"] = s.gen.pool_fallback;
    s.gen.pool_local = false;
    s.gen.pool_waits = 0;
    s.gen.pool_fallback.clear();
    s.gen.pool.clear();
    if (s.gen.started_ms > 0) {
        // A moving average over about the last 20 steps (queueing included: what a session waits).
        const double took = double(clock_.now_ms() - s.gen.started_ms), was = step_ms_.load();
        step_ms_.store(was == 0 ? took : was + (took - was) / 20);
        steps_++;
        step_us_ += int64_t(took * 1000);
    }
    s.gen.started_ms = 0;
    if (!ev.kv_source.empty()) out["kv_source"] = ev.kv_source;
    if (s.trace.step) {
        obs::Span & sp = *s.trace.step;
        sp.set("gen_ai.usage.input_tokens", int64_t(ev.n_prompt));
        sp.set("gen_ai.usage.output_tokens", int64_t(ev.n_generated));
        sp.set("armada.cached_tokens", int64_t(ev.n_cached));
        sp.set("armada.finish_reason", std::string(engine::finish_reason_name(ev.finish)));
        sp.set("armada.ran_on", ran_on);
        if (!upstream.empty()) sp.set("gen_ai.response.model", upstream);
        sp.set("armada.tool_calls", int64_t(msg.tool_calls.size()));
        obs::tracer()->end(std::move(sp));
        s.trace.step.reset();
    }
    s.tools.calls.clear();
    for (size_t i = 0; i < msg.tool_calls.size(); ++i) {
        auto & c = msg.tool_calls[i];
        c.id = "call_" + std::to_string(step) + "_" + std::to_string(i);
        tools::ToolCall tc{
            s.id,    c.id, c.name, c.arguments, s.id + ":" + std::to_string(step) + ":" + std::to_string(i),
            s.owner, {},   {}};
        out["tool_calls"].push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
        s.tools.calls.push_back({tc, false, false});
    }
    s.transcript.messages.push_back(msg);

    host_.stepped(s, common::json_text(out));
}

}  // namespace armada::agent

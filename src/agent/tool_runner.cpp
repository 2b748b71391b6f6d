// The tool runner: sends a step's tool calls (held back while this node's lease is not
// current), and hands each result back to its host once it comes back.

#include "agent/tool_runner.h"

#include "agent/session.h"

#include "obs/log.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace armada::agent {

bool ToolCalls::all_done() const {
    return std::all_of(calls.begin(), calls.end(), [](const PendingCall & c) { return c.done; });
}

ToolRunner::ToolRunner(Host & host, tools::ToolTransport & transport, GenerationPort & engine, obs::Registry & metrics,
                       std::shared_ptr<std::atomic<bool>> alive, Options opt)
    : host_(host),
      transport_(transport),
      engine_(engine),
      metrics_(metrics),
      alive_(std::move(alive)),
      opt_(std::move(opt)),
      hold_(opt_.kv_hold) {}

void ToolRunner::run(Session & s) {
    if (!host_.may_call(s)) return;  // the calls are in the log; the next start sends them
    if (opt_.lease_current && !opt_.lease_current()) {
        if (s.tools.lease_wait) return;
        s.tools.lease_wait = true;
        spdlog::info("session {}: tool calls wait for this node's lease to be current", s.id);
        wait_for_lease(s.id);
        return;
    }
    send(s);
}

void ToolRunner::wait_for_lease(const std::string & id) {
    host_.later(100, [this, id] {
        Session * s = host_.session(id);
        if (!s || !s->tools.lease_wait) return;
        if (s->state != SessionState::WaitingTool || !s->place.started || !host_.may_call(*s)) {
            s->tools.lease_wait = false;
            return;
        }
        if (!opt_.lease_current()) return wait_for_lease(id);
        host_.confirm_held(*s, [this](Session & ss) {
            ss.tools.lease_wait = false;
            if (ss.state == SessionState::WaitingTool && host_.may_call(ss)) send(ss);
        });
    });
}

std::string ToolRunner::hold_key(const Session & s, const std::string & tool) {
    // Latencies are learned per tenant and agent: another tenant's tool of the same name, or its
    // calls, say nothing about this one's.
    return s.owner + '\x1f' + s.agent_id + '\x1f' + tool;
}

void ToolRunner::send(Session & s) {
    std::vector<std::string> sent;  // the hold keys of the tools called now
    for (auto & pc : s.tools.calls) {
        if (pc.started || pc.done) continue;
        pc.started = true;
        ++s.tools.in_flight;
        const HttpToolSpec * spec = nullptr;
        if (s.agent) {
            for (const auto & t : s.agent->tools) {
                if (t.name == pc.call.name) spec = &t;
            }
        }
        if (!spec) {
            tools::ToolResult r;
            r.is_error = true;
            r.content = "tool error: there is no tool named '" + pc.call.name + "'";
            host_.later(0, [this, id = s.id, key = pc.call.idempotency_key, r] { on_result(id, key, r); });
            continue;
        }
        sent.push_back(hold_key(s, pc.call.name));
        HttpToolSpec capped = *spec;
        capped.timeout_ms = std::min(capped.timeout_ms, s.agent->limits.tool_timeout_ms);
        obs::Span sp = obs::Span::start("execute_tool " + pc.call.name, obs::SpanKind::client,
                                        s.trace.turn ? std::optional(s.trace.turn->context()) : std::nullopt);
        sp.set("gen_ai.operation.name", std::string("execute_tool"));
        sp.set("gen_ai.tool.name", pc.call.name);
        sp.set("gen_ai.tool.call.id", pc.call.call_id);
        sp.set("gen_ai.tool.type", std::string(spec->mcp_url.empty() ? "function" : "extension"));
        sp.set("gen_ai.conversation.id", s.id);
        pc.call.traceparent = sp.context().traceparent();
        s.trace.tools[pc.call.idempotency_key] = std::move(sp);
        // Its retries check this node's lease too (the first attempt went through `run`): a
        // retry due while the lease is not current comes back unsent, and goes out again the way
        // the first did (`on_result`).
        tools::ToolCall call = pc.call;
        call.may_send = opt_.lease_current;
        transport_.call(capped, call,
                        [this, alive = alive_, id = s.id, key = pc.call.idempotency_key](tools::ToolResult r) {
                            if (*alive) host_.later(0, [this, id, key, r = std::move(r)] { on_result(id, key, r); });
                        });
    }
    // The session's KV waits in its sequence for as long as these tools usually take, and is
    // parked at once when they usually take too long for that to be worth a sequence.
    if (opt_.hold_tools && !sent.empty()) engine_.hold(s.id, hold_.hold_ms(sent));
}

void ToolRunner::on_result(const std::string & id, const std::string & key, tools::ToolResult r) {
    Session * found = host_.session(id);
    if (!found) return;
    Session & s = *found;
    const obs::LogScope log_scope(s.id, s.trace.context());
    if (s.tools.in_flight > 0) --s.tools.in_flight;
    if (s.state != SessionState::WaitingTool) return host_.stray_result(s);
    PendingCall * pc = nullptr;
    for (auto & c : s.tools.calls) {
        if (c.call.idempotency_key == key) pc = &c;
    }
    if (!pc || pc->done) return;
    if (r.not_sent) {
        // A retry fell due while this node's lease was not current: it goes out again only once
        // the lease is, and a fenced write has confirmed the session is still this node's.
        pc->started = false;
        pc->sent_before += r.attempts;
        if (auto sp = s.trace.tools.find(key); sp != s.trace.tools.end()) {
            sp->second.set("armada.tool.attempts", int64_t(r.attempts));
            sp->second.fail("not sent again: the node's lease was not current");
            obs::tracer()->end(std::move(sp->second));
            s.trace.tools.erase(sp);
        }
        spdlog::info("session {}: a retry of tool call {} waits for this node's lease", s.id, key);
        if (!s.tools.lease_wait && host_.may_call(s)) {
            s.tools.lease_wait = true;
            wait_for_lease(s.id);
        }
        return;
    }
    pc->done = true;
    // Only calls that reached a tool of the agent teach the hold (a name the model made up is
    // answered at once, and would teach it nothing true).
    if (s.agent && std::any_of(s.agent->tools.begin(), s.agent->tools.end(),
                               [&](const HttpToolSpec & t) { return t.name == pc->call.name; }))
        hold_.observe(hold_key(s, pc->call.name), int64_t(r.latency_s * 1000));
    const std::string outcome = r.is_error ? "error" : "ok";
    if (r.is_error) errors_++;
    if (auto sp = s.trace.tools.find(key); sp != s.trace.tools.end()) {
        sp->second.set("armada.tool.attempts", int64_t(r.attempts));
        if (r.http_status > 0) sp->second.set("http.response.status_code", int64_t(r.http_status));
        if (r.is_error) sp->second.fail("the tool call failed");  // its output may hold data: not copied
        obs::tracer()->end(std::move(sp->second));
        s.trace.tools.erase(sp);
    }
    metrics_
        .counter("armada_tool_calls_total", "Tool calls by tool and result",
                 {{"tool", pc->call.name}, {"result", outcome}})
        .inc();
    metrics_
        .histogram("armada_tool_call_seconds", "Tool call latency by tool", obs::latency_buckets(),
                   {{"tool", pc->call.name}})
        .observe(r.latency_s);

    host_.finished(s, *pc, r, s.tools.all_done());
}

}  // namespace armada::agent

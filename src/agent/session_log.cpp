// The session log: what a session writes to the store (its record and steps), in order and one
// batch at a time, and how a session is rebuilt from what was written.

#include "agent/session_log.h"

#include "agent/session.h"

#include "agent/transcript_json.h"
#include "common/backoff.h"
#include "common/json_fields.h"
#include "obs/log.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>

namespace armada::agent {

using json = nlohmann::json;

SessionLog::SessionLog(Host & host, store::SessionLog & store, obs::Registry & metrics, const Clock & clock,
                       std::shared_ptr<std::atomic<bool>> alive, Options opt)
    : host_(host), store_(store), metrics_(metrics), clock_(clock), alive_(std::move(alive)), opt_(std::move(opt)) {}

std::unique_ptr<Session> SessionLog::rebuild(const store::SessionRecord & r,
                                             const std::vector<store::StepRecord> & steps,
                                             uint64_t kv_bytes_per_token) {
    const auto st = parse_state(r.state);
    if (!st) {
        spdlog::warn("session {}: unknown state '{}' in the store", r.id, r.state);
        return nullptr;
    }
    auto sp = std::make_unique<Session>();
    Session & s = *sp;
    s.id = r.id;
    s.agent_id = r.agent_id;
    s.owner = r.owner;
    s.state = s.log.logged = *st;
    s.reason = r.reason;
    s.created_ms = r.created_ms;
    const json data = json::parse(r.data, nullptr, false);
    if (data.is_object()) {
        s.transcript.model_steps = data.value("model_steps", 0);
        s.transcript.prompt_tokens = data.value("prompt_tokens", int64_t(0));
        s.transcript.completion_tokens = data.value("completion_tokens", int64_t(0));
        s.transcript.compactions = data.value("compactions", 0);
        s.transcript.dropped_tools = data.value("dropped_tools", 0);
    }
    s.trace.last = obs::TraceContext::in_record(r.data);
    // The context, rebuilt from the log: every durable step, in order, once.
    for (const auto & step : steps) {
        s.log.next_seq = step.seq + 1;
        const json p = json::parse(step.payload, nullptr, false);
        if (!p.is_object()) continue;
        if (step.kind == "user_input") {
            common_chat_msg m;
            m.role = "user";
            m.content = p.value("content", "");
            s.transcript.messages.push_back(m);
        } else if (step.kind == "model_output") {
            s.transcript.messages.push_back(assistant_message(p));
            s.tools.calls.clear();
            const int32_t step_no = p.value("step", 0);
            const int64_t kvt = p.value("kv_tokens", int64_t(0));
            s.transcript.kv_history.push_back({step_no, kvt, uint64_t(kvt) * kv_bytes_per_token});
        } else if (step.kind == "tool_call") {
            tools::ToolCall tc{
                s.id, p.value("id", ""), p.value("name", ""), p.value("arguments", ""), step.idempotency, s.owner, {},
                {}};
            s.tools.calls.push_back({tc, false, false});
        } else if (step.kind == "tool_result") {
            common_chat_msg m;
            m.role = "tool";
            m.tool_call_id = p.value("call_id", "");
            m.tool_name = p.value("name", "");
            m.content = p.value("content", "");
            s.transcript.messages.push_back(m);
            for (auto & c : s.tools.calls) {
                if (c.call.idempotency_key == step.idempotency) c.done = true;
            }
        }
    }
    s.stream.start_at({s.log.next_seq - 1, 0});
    s.log.durable = s.snapshot();
    return sp;
}

store::SessionRecord SessionLog::record(const Session & s) const {
    store::SessionRecord r;
    r.id = s.id;
    r.agent_id = s.agent_id;
    r.owner = s.owner;
    r.state = state_name(s.state);
    r.reason = s.reason;
    json data = {{"model_steps", s.transcript.model_steps},
                 {"prompt_tokens", s.transcript.prompt_tokens},
                 {"completion_tokens", s.transcript.completion_tokens},
                 {"compactions", s.transcript.compactions},
                 {"dropped_tools", s.transcript.dropped_tools}};
    if (s.trace.last) data["traceparent"] = s.trace.last->traceparent();
    r.data = common::json_text(data);
    r.created_ms = s.created_ms;
    r.updated_ms = clock_.now_ms();
    r.cell = opt_.cell;  // kept by the store only when the row is first written
    return r;
}

store::StepRecord SessionLog::step(Session & s, const std::string & kind, const std::string & payload,
                                   const std::string & key) {
    store::StepRecord r;
    r.session_id = s.id;
    r.seq = s.log.next_seq++;
    r.kind = kind;
    r.payload = payload;
    r.idempotency = key;
    r.ts_ms = clock_.now_ms();
    return r;
}

void SessionLog::checkpoint(Session & s, store::Batch b, std::function<void(Session &)> after,
                            std::function<void(Outcome)> reply) {
    // Every change of state is a step too, so the log alone replays the session's events.
    if (s.state != s.log.logged) {
        json d = {{"state", state_name(s.state)}};
        if (has_ended(s.state) && !s.reason.empty()) d["reason"] = s.reason;
        b.steps.push_back(step(s, "state", common::json_text(d)));
        s.log.logged = s.state;
    }
    b.sessions.push_back(record(s));
    persist(s, std::move(b), std::move(after), std::move(reply));
}

void SessionLog::persist(Session & s, store::Batch b, std::function<void(Session &)> after,
                         std::function<void(Outcome)> reply) {
    s.log.outbox.push_back({std::move(b), std::move(after), s.snapshot(), std::move(reply)});
    send_next(s);
}

void SessionLog::send_next(Session & s) {
    if (s.log.committing || s.log.outbox.empty()) return;
    s.log.committing = true;
    store::Batch b = s.log.outbox.front().batch;
    if (!opt_.node.empty()) {
        // Fencing: written only while the session is still this node's, under its epoch.
        if (s.place.claim >= 0)
            b.assign.push_back({s.id, opt_.node, s.place.claim + 1, opt_.cell});  // the row moves to this cell too
        else
            b.fences.push_back({s.id, opt_.node, s.place.epoch});
    }
    store_.commit(std::move(b), [this, alive = alive_, id = s.id](store::Status st) {
        // The store's thread: hand over, never touch sessions here.
        if (*alive) host_.later(0, [this, id, st] { on_committed(id, st); });
    });
}

void SessionLog::on_committed(const std::string & id, store::Status st) {
    Session * found = host_.session(id);
    if (!found) return;
    Session & s = *found;
    const obs::LogScope log_scope(s.id, s.trace.context());
    s.log.committing = false;
    if (st.fenced && !opt_.node.empty()) return host_.fenced(s, st.error);
    if (!st.ok) {
        // Nothing was acknowledged: say so, and write the same batch again after a pause.
        ++s.log.commit_failures;
        metrics_.counter("armada_store_write_failures_total", "Checkpoint writes that failed and were retried").inc();
        failures_++;
        s.stream.transient("error",
                           common::json_text(json{{"message", "checkpoint write failed, retrying: " + st.error}}));
        // Jittered, so that the sessions a restart of the store stopped together do not all try
        // again at the same instants.
        const int delay = common::jittered_ms(int(common::backoff_ms(100, s.log.commit_failures, 5000)));
        host_.later_unlocked(delay, [this, id] {
            store_.recover();  // may block: never under the table's lock
            host_.later(0, [this, id] {
                if (Session * again = host_.session(id)) send_next(*again);
            });
        });
        return;
    }
    s.log.commit_failures = 0;
    if (s.place.claim >= 0) {
        s.place.epoch = s.place.claim + 1;
        s.place.claim = -1;
        // Said for checks that read the logs (the chaos test's "one node per session and epoch").
        spdlog::info("session {}: runs here under epoch {} (claimed by this node)", s.id, s.place.epoch);
    }
    auto done = std::move(s.log.outbox.front());
    s.log.outbox.pop_front();
    s.log.durable = std::move(done.snapshot);
    // The batch is on disk: its steps become events, in order, with their step numbers as ids.
    if (!s.erased) {
        for (const auto & step : done.batch.steps) {
            if (auto ev = step_event(step)) s.stream.deliver(std::move(*ev));
        }
    }
    if (done.after) done.after(s);
    send_next(s);
    host_.written(s);
}

}  // namespace armada::agent

// The session manager as the host of its parts: how a session goes from one part to the next.
// A step's reply is recorded, then its tool calls go out (the tool runner) or the turn ends; a
// tool result is recorded, and the last one starts the next step (the step runner); a session
// the placement loads from the store goes on from the state it was left in; a write the store
// refused stops the session (the placement). Also the table's timers and lock, as the parts
// ask for them.

#include "agent/session_manager.h"

#include "agent/session.h"
#include "common/json_fields.h"
#include "obs/log.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

namespace armada::agent {

using json = nlohmann::json;
namespace net = boost::asio;

void SessionManager::post(std::function<void()> fn, const net::any_io_executor & on) {
    net::post(on ? on : io_, [alive = alive_, fn = std::move(fn)] {
        if (*alive) fn();
    });
}

void SessionManager::after_ms(int ms, std::function<void()> fn) {
    auto t = std::make_shared<net::steady_timer>(io_, std::chrono::milliseconds(ms));
    t->async_wait([t, alive = alive_, fn = std::move(fn)](boost::system::error_code ec) {
        if (!ec && *alive) fn();
    });
}

// ---- the host of the session log, the step runner, the tool runner and the placement ----

void SessionManager::later(int ms, std::function<void()> fn) {
    later_unlocked(ms, [this, fn = std::move(fn)] {
        std::lock_guard lk(mu_);
        fn();
    });
}

void SessionManager::locked(const std::function<void()> & fn) {
    std::lock_guard lk(mu_);
    fn();
}

void SessionManager::stepped(Session & s, const std::string & output) {
    store::Batch b;
    b.steps.push_back(log_.step(s, "model_output", output));
    for (const auto & pc : s.tools.calls) {
        b.steps.push_back(log_.step(s, "tool_call",
                                    common::json_text(json{{"step", s.transcript.model_steps},
                                                           {"id", pc.call.call_id},
                                                           {"name", pc.call.name},
                                                           {"arguments", pc.call.arguments}}),
                                    pc.call.idempotency_key));
    }
    const bool calls = !s.tools.calls.empty();
    apply(s, calls ? SessionEvent::ToolsCalled : SessionEvent::Answered);
    log_.checkpoint(s, std::move(b), [this, calls](Session & ss) {
        if (calls) {
            tool_runner_.run(ss);
        } else {
            step_runner_.end_turn(ss, {});
            count_outcome(ss);
        }
    });
}

void SessionManager::later_unlocked(int ms, std::function<void()> fn) {
    if (ms <= 0)
        post(std::move(fn));
    else
        after_ms(ms, std::move(fn));
}

void SessionManager::fenced(Session & s, const std::string & why) {
    placement_.drop_fenced(s, why);
}

void SessionManager::written(Session & s) {
    if (s.erased && s.log.outbox.empty() && !s.log.committing) {
        count_state(s.state, -1);
        const std::string id = s.id;
        sessions_.erase(id);  // s is gone after this
        sync_memory_gauge();
        return;
    }
    maybe_evict(s);
}

Session * SessionManager::session(const std::string & id) {
    auto it = sessions_.find(id);
    return it == sessions_.end() ? nullptr : it->second.get();
}

bool SessionManager::may_call(const Session & s) const {
    return !draining_ && s.place.leaving_ms == 0;
}

void SessionManager::confirm_held(Session & s, std::function<void(Session &)> then) {
    log_.persist(s, {}, std::move(then));
}

void SessionManager::stray_result(Session & s) {
    maybe_evict(s);
}

void SessionManager::finished(Session & s, const PendingCall & pc, const tools::ToolResult & r, bool all) {
    common_chat_msg tm;
    tm.role = "tool";
    tm.tool_call_id = pc.call.call_id;
    tm.tool_name = pc.call.name;
    tm.content = r.content;
    s.transcript.messages.push_back(tm);

    store::Batch b;
    b.steps.push_back(log_.step(s, "tool_result",
                                common::json_text(json{{"call_id", pc.call.call_id},
                                                       {"name", pc.call.name},
                                                       {"content", r.content},
                                                       {"is_error", r.is_error},
                                                       {"http_status", r.http_status},
                                                       {"attempts", pc.sent_before + r.attempts}}),
                                pc.call.idempotency_key));
    if (all) apply(s, SessionEvent::ToolsDone);
    log_.checkpoint(s, std::move(b), [this, all](Session & ss) {
        if (all && ss.state == SessionState::Running) step_runner_.run(ss);
    });
}

std::unique_lock<std::mutex> SessionManager::lock() {
    return std::unique_lock(mu_);
}

std::vector<Session *> SessionManager::all_sessions() {
    std::vector<Session *> out;
    out.reserve(sessions_.size());
    for (auto & [id, s] : sessions_)
        out.push_back(s.get());
    return out;
}

bool SessionManager::draining() const {
    return draining_;
}

void SessionManager::install(std::unique_ptr<Session> sp) {
    const SessionState st = sp->state;
    auto & slot = sessions_[sp->id];
    if (slot) count_state(slot->state, -1);
    slot = std::move(sp);
    sync_memory_gauge();
    count_state(st, +1);
}

void SessionManager::drop(Session & s, const std::string & error) {
    step_runner_.end_turn(s, error);
    s.stream.end();
    count_state(s.state, -1);
    const std::string id = s.id;
    sessions_.erase(id);  // s is gone after this
    sync_memory_gauge();
}

void SessionManager::resume(Session & s) {
    const obs::LogScope log_scope(s.id, s.trace.context());
    s.stream.transient("resumed", common::json_text(json{{"state", state_name(s.state)}}));
    if (!s.agent) {
        spdlog::warn("session {}: its agent '{}' no longer exists", s.id, s.agent_id);
        fail(s, SessionEvent::Error, "its agent '" + s.agent_id + "' no longer exists");
        return;
    }
    if (s.state == SessionState::WaitingTool) {
        // Completed calls keep their recorded results; the rest go out again with the same key.
        if (s.tools.all_done()) {
            apply(s, SessionEvent::ToolsDone);
            log_.checkpoint(s, {}, [this](Session & ss) { step_runner_.run(ss); });
        } else {
            tool_runner_.run(s);
        }
    } else if (s.state == SessionState::Queued) {
        apply(s, SessionEvent::Start);
        log_.checkpoint(s, {}, [this](Session & ss) { step_runner_.run(ss); });
    } else if (s.state == SessionState::Running) {
        step_runner_.run(s);
    }
}

}  // namespace armada::agent

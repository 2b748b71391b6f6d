#include "agent/session_state.h"

namespace armada::agent {

std::optional<SessionState> transition(SessionState from, SessionEvent ev) {
    using S = SessionState;
    using E = SessionEvent;
    const bool live = from == S::Queued || from == S::Running || from == S::WaitingTool || from == S::WaitingInput;
    switch (ev) {
        case E::Start:
            if (from == S::Queued) return S::Running;
            break;
        case E::AwaitInput:
            if (from == S::Queued) return S::WaitingInput;
            break;
        case E::ToolsCalled:
            if (from == S::Running) return S::WaitingTool;
            break;
        case E::ToolsDone:
            if (from == S::WaitingTool) return S::Running;
            break;
        case E::Answered:
            if (from == S::Running) return S::Completed;
            break;
        case E::UserMessage:
            if (from == S::WaitingInput || from == S::Completed) return S::Running;
            break;
        case E::LimitReached:
        case E::Error:
            if (live) return S::Failed;
            break;
        case E::Cancel:
            if (live) return S::Cancelled;
            break;
    }
    return std::nullopt;
}

const char * state_name(SessionState s) {
    switch (s) {
        case SessionState::Queued:
            return "queued";
        case SessionState::Running:
            return "running";
        case SessionState::WaitingTool:
            return "waiting_tool";
        case SessionState::WaitingInput:
            return "waiting_input";
        case SessionState::Completed:
            return "completed";
        case SessionState::Failed:
            return "failed";
        case SessionState::Cancelled:
            return "cancelled";
    }
    return "failed";
}

std::optional<SessionState> parse_state(const std::string & name) {
    for (auto s : {SessionState::Queued, SessionState::Running, SessionState::WaitingTool, SessionState::WaitingInput,
                   SessionState::Completed, SessionState::Failed, SessionState::Cancelled}) {
        if (name == state_name(s)) return s;
    }
    return std::nullopt;
}

bool is_final(SessionState s) {
    return s == SessionState::Failed || s == SessionState::Cancelled;
}

bool has_ended(SessionState s) {
    return s == SessionState::Completed || is_final(s);
}

}  // namespace armada::agent

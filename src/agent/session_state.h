#pragma once

#include <optional>
#include <string>

namespace armada::agent {

//! The life of a session. Every change goes through `transition`.
//!
//!   queued ──start──▶ running ──tools_called──▶ waiting_tool ──tools_done──▶ running
//!                        │  ▲
//!                        │  └──────────── user_message ──── completed / waiting_input
//!                        └──answered──▶ completed
//!   any live state ──limit/error──▶ failed,  ──cancel──▶ cancelled
enum class SessionState { Queued, Running, WaitingTool, WaitingInput, Completed, Failed, Cancelled };

enum class SessionEvent {
    Start,         // a queued session begins its first model step
    ToolsCalled,   // the model step asked for tools
    ToolsDone,     // every tool call of the step has a durable result
    Answered,      // the model step gave a final answer
    UserMessage,   // a new user turn arrived
    AwaitInput,    // created without input: wait for the first message
    LimitReached,  // max_steps, token budget or deadline
    Error,         // the step cannot go on (engine or store gave up)
    Cancel,        // the client cancelled
};

//! The state after `ev` in `from`, or nullopt when the event is not allowed there.
std::optional<SessionState> transition(SessionState from, SessionEvent ev);

const char * state_name(SessionState s);
std::optional<SessionState> parse_state(const std::string & name);
//! Failed and cancelled sessions are over; a completed one may take another user turn.
bool is_final(SessionState s);
//! States in which the session has ended, for chain survival and for recovery.
bool has_ended(SessionState s);

}  // namespace armada::agent

#pragma once

// The session manager's own view of one session, shared by its parts (session_manager.cpp,
// session_log.cpp, step_runner.cpp, placement.cpp), the tool runner, and their unit tests.
// Every field is guarded by SessionManager::mu_.

#include "agent/session_manager.h"
#include "agent/tool_runner.h"

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace armada::agent {

//! The states an ended session's row can be in (store queries).
inline const std::vector<std::string> kEnded = {"completed", "failed", "cancelled"};

struct Session {
    //! The conversation: its messages and what its steps used.
    struct Transcript {
        std::vector<common_chat_msg> messages;  // without the system message
        int32_t model_steps = 0;
        int64_t prompt_tokens = 0, completion_tokens = 0;
        int32_t dropped_tools = 0;  // oldest tool outputs left out of the prompt by compaction
        int32_t compactions = 0;
        std::vector<SessionView::KvPoint> kv_history;  // its KV after each model step
    };

    //! The model step under way, here or on a GPU pool (step_runner.cpp).
    struct Generation {
        uint64_t id = 0;  // bumped by each step; a late callback with an older id is dropped
        std::shared_ptr<engine::ChatTurn> turn;
        std::string text;
        std::shared_ptr<std::atomic<bool>> cancel;  // set while a step runs
        int32_t engine_retries = 0;
        int64_t started_ms = 0;  // when this node began the step under way (0: none)
        // GPU pools: the pool the step under way went to ("": this node); `pool_local` keeps the
        // step here after its pool failed (`pool_fallback` says which and why).
        std::string pool;
        bool pool_local = false;
        std::string pool_fallback;
        int32_t pool_waits = 0;  // waits for a pool the step's prompt cannot leave
    };

    //! Traces: a turn is one `invoke_agent` span, with a `chat` span per model step and an
    //! `execute_tool` span per tool call (by idempotency key) under it.
    struct Tracing {
        std::optional<obs::TraceContext> parent;  // the request that starts the next turn
        std::optional<obs::Span> turn, step;
        // The trace the session is in: its current or last turn's span (untraced here, the
        // context that turn came with). Kept in its record, so a brain that moves it continues
        // that trace.
        std::optional<obs::TraceContext> last;
        std::map<std::string, obs::Span> tools;
        int64_t turn_prompt_tokens = 0, turn_completion_tokens = 0;  // the counts when the turn began

        //! What the session's log lines are tagged with: the turn's span, else the request's.
        std::optional<obs::TraceContext> context() const { return turn ? std::optional(turn->context()) : parent; }
    };

    //! What readers see: the session as of its last durable batch, never ahead of the store.
    struct Durable {
        SessionState state = SessionState::Queued;
        std::string reason;
        size_t transcript_len = 0;
        int32_t model_steps = 0;
        int64_t prompt_tokens = 0, completion_tokens = 0;
    };

    //! A batch waiting for its turn to be written.
    struct Pending {
        store::Batch batch;
        std::function<void(Session &)> after;
        Durable snapshot;
        std::function<void(Outcome)> reply;  // a caller waiting for this batch
    };

    //! Durability (session_log.cpp): batches go to the store one at a time, in order.
    struct Log {
        SessionState logged = SessionState::Queued;  // the state the last state step recorded
        int64_t next_seq = 1;                        // of the next step record
        Durable durable;
        std::deque<Pending> outbox;
        bool committing = false;
        int commit_failures = 0;
    };

    //! Cluster mode: where the session runs (placement.cpp).
    struct Placement {
        int64_t epoch = 0;  // the assignment this node writes under
        // >= 0: the node takes the session over with its next batch (assignment epoch `claim`
        // + 1), as for a message to a session whose node is gone.
        int64_t claim = -1;
        // This node runs it (created, resumed, adopted or given a message here). A copy loaded
        // only to be read or streamed is not started: `adopt` replaces it with the store's state.
        bool started = false;
        // Offered to move to another node with its KV since this time (`offer_to_move`): its
        // next model step or tool call waits. 0: not offered.
        int64_t leaving_ms = 0;
    };

    std::string id, agent_id, owner;  // owner: the tenant
    std::shared_ptr<const AgentSpec> agent;
    SessionState state = SessionState::Queued;
    std::string reason;
    int64_t created_ms = 0;
    Transcript transcript;
    Generation gen;
    ToolCalls tools;  // the tool calls of the current step (tool_runner.h)
    Tracing trace;
    Log log;
    Placement place;
    EventStream stream;  // its recent events and subscribers
    bool erased = false;

    bool busy() const { return gen.cancel || tools.in_flight > 0 || log.committing || !log.outbox.empty(); }
    Durable snapshot() const {
        return {state,
                reason,
                transcript.messages.size(),
                transcript.model_steps,
                transcript.prompt_tokens,
                transcript.completion_tokens};
    }
};

}  // namespace armada::agent

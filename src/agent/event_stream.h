#pragma once

// A session's stream of events, as SSE clients read it: the steps of its log (message, tool
// call, tool result, state), numbered by step, and the events that are not stored (tokens, a
// compaction, an error, a resume notice) numbered between them. A client that comes back with
// Last-Event-ID gets what it missed: the durable events from the store, the recent ones from
// memory, each once and in order.
//
// Owns: a session's recent events and its subscribers. No lock of its own: the session
// manager's guards it, as it guards the session that holds it.

#include "agent/transcript_json.h"
#include "store/store.h"

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace armada::agent {

//! Where an event sits in a session's stream. Durable events (message, tool_call, tool_result,
//! state) are the steps of the log: their id is the step's `seq`, the same after any restart.
//! Events that are not stored (token, compaction, error, a resume notice) come between two
//! steps: `seq` is the last step before them and `sub` counts from 1. The text form is "12" or
//! "12.3"; clients send it back as Last-Event-ID.
struct EventId {
    int64_t seq = 0;
    int32_t sub = 0;
    std::string text() const {
        return sub == 0 ? std::to_string(seq) : std::to_string(seq) + "." + std::to_string(sub);
    }
    //! Parses "12" or "12.3"; nullopt for anything else.
    static std::optional<EventId> parse(const std::string & s);
    // Ordered by step, then by place after it. (Written out: clang-tidy 14 misreads a defaulted <=>.)
    bool operator<(const EventId & o) const { return seq != o.seq ? seq < o.seq : sub < o.sub; }
    bool operator>(const EventId & o) const { return o < *this; }
    bool operator<=(const EventId & o) const { return !(o < *this); }
    bool operator==(const EventId & o) const { return seq == o.seq && sub == o.sub; }
    bool operator!=(const EventId & o) const { return !(*this == o); }
};

//! One event of a session's stream. `data` is a JSON object.
struct SessionEventRecord {
    EventId id;
    std::string type;  // token, message, tool_call, tool_result, state, error, compaction
    std::string data;
};

//! The durable event a step stands for, if any (user input has none).
std::optional<SessionEventRecord> step_event(const store::StepRecord & step);

class EventStream {
  public:
    using OnEvent = std::function<void(const SessionEventRecord &)>;
    using OnEnd = std::function<void()>;
    //! The most recent events kept in memory; older durable ones are read from the store.
    static constexpr size_t kKept = 20000;

    //! Sends `ev` to every subscriber and keeps it; it is now the newest.
    void deliver(SessionEventRecord ev);
    //! An event that is not stored, numbered after the newest.
    void transient(const std::string & type, const std::string & data);
    //! The newest event delivered (a session rebuilt from its log starts at its last step).
    EventId last() const { return last_; }
    void start_at(EventId id) { last_ = id; }

    //! What a subscriber that saw up to `after` missed: the durable events of `steps` (the log
    //! as read from the store) up to the newest delivered, then the recent ones kept here,
    //! in order and each once. Newer steps come live.
    std::vector<SessionEventRecord> missed(const std::vector<store::StepRecord> & steps, EventId after) const;
    void subscribe(uint64_t handle, OnEvent on_event, OnEnd on_end);
    void unsubscribe(uint64_t handle) { subs_.erase(handle); }
    bool watched() const { return !subs_.empty(); }
    //! Ends every subscriber's stream (the session ended, or is gone from here).
    void end();
    //! Takes the subscribers of `old` (a copy this one replaces) and sends them the durable
    //! events of `steps` that `old` had not delivered.
    void take_over(EventStream & old, const std::vector<store::StepRecord> & steps);

  private:
    std::deque<SessionEventRecord> events_;
    EventId last_{0, 0};
    std::map<uint64_t, std::pair<OnEvent, OnEnd>> subs_;
};

}  // namespace armada::agent

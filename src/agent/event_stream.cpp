#include "agent/event_stream.h"

#include "common/json_fields.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>

namespace armada::agent {

using json = nlohmann::json;

namespace {
std::string dump(const json & j) {
    return common::json_text(j);
}
std::string text(const json & p, const char * key) {
    return common::string_field(p, key).value_or("");
}
}  // namespace

std::optional<EventId> EventId::parse(const std::string & s) {
    EventId id;
    const auto dot = s.find('.');
    auto number = [](const std::string & t, int64_t & out) {
        if (t.empty() || t.size() > 18) return false;
        for (char c : t) {
            if (c < '0' || c > '9') return false;
        }
        out = std::stoll(t);
        return true;
    };
    int64_t sub = 0;
    if (!number(s.substr(0, dot), id.seq)) return std::nullopt;
    if (dot != std::string::npos && (!number(s.substr(dot + 1), sub) || sub > INT32_MAX)) return std::nullopt;
    id.sub = int32_t(sub);
    return id;
}

std::optional<SessionEventRecord> step_event(const store::StepRecord & step) {
    const json p = json::parse(step.payload, nullptr, false);
    if (!p.is_object()) return std::nullopt;
    SessionEventRecord ev;
    ev.id = {step.seq, 0};
    if (step.kind == "model_output") {
        ev.type = "message";
        ev.data = dump(message_json(assistant_message(p)));
    } else if (step.kind == "tool_call") {
        ev.type = "tool_call";
        ev.data = dump(json{{"id", text(p, "id")},
                            {"name", text(p, "name")},
                            {"arguments", text(p, "arguments")},
                            {"idempotency_key", step.idempotency}});
    } else if (step.kind == "tool_result") {
        ev.type = "tool_result";
        ev.data = dump(json{{"call_id", text(p, "call_id")},
                            {"name", text(p, "name")},
                            {"content", text(p, "content")},
                            {"is_error", common::bool_field(p, "is_error").value_or(false)}});
    } else if (step.kind == "state") {
        ev.type = "state";
        json d = {{"state", text(p, "state")}};
        if (const std::string reason = text(p, "reason"); !reason.empty()) d["reason"] = reason;
        ev.data = dump(d);
    } else {
        return std::nullopt;
    }
    return ev;
}

void EventStream::deliver(SessionEventRecord ev) {
    last_ = ev.id;
    for (auto & [h, sub] : subs_)
        sub.first(ev);
    events_.push_back(std::move(ev));
    if (events_.size() > kKept) events_.pop_front();
}

void EventStream::transient(const std::string & type, const std::string & data) {
    deliver(SessionEventRecord{{last_.seq, last_.sub + 1}, type, data});
}

std::vector<SessionEventRecord> EventStream::missed(const std::vector<store::StepRecord> & steps, EventId after) const {
    std::vector<SessionEventRecord> out;
    for (const auto & step : steps) {
        if (step.seq > last_.seq) break;  // not delivered yet: it comes live
        if (EventId{step.seq, 0} <= after) continue;
        if (auto ev = step_event(step)) out.push_back(std::move(*ev));
    }
    for (const auto & ev : events_) {
        if (ev.id > after) out.push_back(ev);
    }
    std::sort(out.begin(), out.end(),
              [](const SessionEventRecord & a, const SessionEventRecord & b) { return a.id < b.id; });
    out.erase(std::unique(out.begin(), out.end(),
                          [](const SessionEventRecord & a, const SessionEventRecord & b) { return a.id == b.id; }),
              out.end());
    return out;
}

void EventStream::subscribe(uint64_t handle, OnEvent on_event, OnEnd on_end) {
    subs_[handle] = {std::move(on_event), std::move(on_end)};
}

void EventStream::end() {
    auto subs = std::move(subs_);
    subs_.clear();
    for (auto & [h, sub] : subs) {
        if (sub.second) sub.second();
    }
}

void EventStream::take_over(EventStream & old, const std::vector<store::StepRecord> & steps) {
    subs_ = std::move(old.subs_);
    old.subs_.clear();
    for (const auto & step : steps) {
        if (step.seq <= old.last_.seq) continue;
        if (auto ev = step_event(step)) {
            for (auto & [h, sub] : subs_)
                sub.first(*ev);
        }
    }
}

}  // namespace armada::agent

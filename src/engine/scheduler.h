#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace armada::engine {

//! How the engine orders waiting requests for a free sequence, and prompt chunks in a batch.
//! A request belongs to a program: an agent session, a Responses chain or a chat conversation.
//! - `plas`: the program that has received the least service so far (tokens computed for it:
//!   prompt tokens not reused, plus generated ones) goes first (Autellix's PLAS).
//! - `program-fcfs`: the program that arrived first goes first, so started programs finish
//!   before new ones take the engine.
//! - `fcfs`: requests in the order they arrived, whatever their program.
//! Under every policy a request that has waited `starve_ms` goes before those that have not
//! (oldest first), so no program waits without bound.
enum class SchedPolicy { Plas, ProgramFcfs, Fcfs };

std::optional<SchedPolicy> parse_sched_policy(const std::string & name);
const char * sched_policy_name(SchedPolicy p);

//! One waiting request as the scheduler sees it.
struct SchedTicket {
    std::string program;       // tenant-scoped program key (Scheduler::program_key)
    int64_t submitted_ms = 0;  // when the request reached the engine
    uint64_t seq = 0;          // arrival order, for ties
};

//! Program bookkeeping and the order of admission. Pure: the caller passes the time in, so tests
//! run it on a scripted clock. Engine thread only.
class Scheduler {
  public:
    struct Program {
        int64_t first_ms = 0;  // its first request
        int64_t last_ms = 0;   // its latest request or charge
        uint64_t service = 0;  // tokens computed for it so far
    };

    explicit Scheduler(SchedPolicy policy = SchedPolicy::Plas, int64_t starve_ms = 10000,
                       int64_t forget_ms = 30 * 60 * 1000, size_t max_programs = 65536);

    //! A program key that cannot cross tenants: another tenant naming the same program gets
    //! another key.
    static std::string program_key(const std::string & tenant, const std::string & program);

    SchedPolicy policy() const { return policy_; }
    int64_t starve_ms() const { return starve_ms_; }

    //! A request of `program` arrived: the program is known from now on (its arrival time is
    //! its first request's).
    void arrive(const std::string & program, int64_t now_ms);
    //! `tokens` were computed for `program`.
    void charge(const std::string & program, uint64_t tokens, int64_t now_ms);
    //! Service received so far; 0 for an unknown program.
    uint64_t service(const std::string & program) const;
    const Program * find(const std::string & program) const;
    size_t programs() const { return programs_.size(); }

    //! A ticket's place in the order at `now_ms`: smaller goes first.
    struct Rank {
        int starved = 1;  // 0: waited `starve_ms` already
        uint64_t service = 0;
        int64_t first_ms = 0;
        uint64_t seq = 0;
        bool operator<(const Rank & o) const {
            if (starved != o.starved) return starved < o.starved;
            if (service != o.service) return service < o.service;
            if (first_ms != o.first_ms) return first_ms < o.first_ms;
            return seq < o.seq;
        }
    };
    Rank rank(const std::string & program, int64_t submitted_ms, uint64_t seq, int64_t now_ms) const;
    Rank rank(const SchedTicket & t, int64_t now_ms) const { return rank(t.program, t.submitted_ms, t.seq, now_ms); }
    //! Whether `a` goes before `b` at `now_ms`.
    bool before(const SchedTicket & a, const SchedTicket & b, int64_t now_ms) const {
        return rank(a, now_ms) < rank(b, now_ms);
    }
    //! Indices of `waiting` in the order they are to be served.
    std::vector<size_t> order(const std::vector<SchedTicket> & waiting, int64_t now_ms) const;
    bool starved(int64_t submitted_ms, int64_t now_ms) const { return now_ms - submitted_ms >= starve_ms_; }
    bool starved(const SchedTicket & t, int64_t now_ms) const { return starved(t.submitted_ms, now_ms); }

    //! Forgets programs idle for `forget_ms`, and beyond `max_programs` the least recently seen
    //! (down to 90% of it, so the sort this takes is rare). `busy` says whether a program still
    //! has requests in the engine; those are kept.
    template <class Busy>
    void expire(int64_t now_ms, Busy busy);

  private:
    SchedPolicy policy_;
    int64_t starve_ms_;
    int64_t forget_ms_;
    size_t max_programs_;
    std::unordered_map<std::string, Program> programs_;
};

template <class Busy>
void Scheduler::expire(int64_t now_ms, Busy busy) {
    for (auto it = programs_.begin(); it != programs_.end();) {
        if (now_ms - it->second.last_ms >= forget_ms_ && !busy(it->first)) {
            it = programs_.erase(it);
        } else {
            ++it;
        }
    }
    if (programs_.size() <= max_programs_) return;
    const size_t target = max_programs_ - max_programs_ / 10;
    std::vector<std::pair<int64_t, const std::string *>> by_age;
    by_age.reserve(programs_.size());
    for (const auto & [k, p] : programs_)
        by_age.emplace_back(p.last_ms, &k);
    std::sort(by_age.begin(), by_age.end());
    std::vector<std::string> drop;
    size_t left = programs_.size();
    for (const auto & [at, k] : by_age) {
        if (left <= target) break;
        if (busy(*k)) continue;
        drop.push_back(*k);
        --left;
    }
    for (const auto & k : drop)
        programs_.erase(k);
}

//! Whether an idle session's KV is parked now: a held one when its hold ends (`hold_until`), an
//! unheld one once it has idled `grace` since `idle_since`. Pure, for tests on a scripted clock.
template <class TimePoint, class Duration>
bool park_due(bool held, TimePoint hold_until, TimePoint idle_since, Duration grace, TimePoint now) {
    return held ? now >= hold_until : now - idle_since >= grace;
}

//! How long a session's KV stays in its sequence while the session waits on a tool, learned
//! from that tool's observed latencies (Continuum's time-to-live). Holding is worth it when the
//! call usually returns soon: the hold is the `quantile` of the tool's last `window` latencies
//! plus `margin_ms`. A tool that usually takes longer than `max_hold_ms` gets no hold (its KV
//! is parked at once: the sequence would idle too long). A tool seen fewer than `min_samples`
//! times gets `default_ms`. Thread-safe.
class KvHold {
  public:
    struct Options {
        size_t max_tools = 10000;  // tools remembered; beyond, an arbitrary one is forgotten
        double quantile = 0.9;
        size_t window = 64;
        size_t min_samples = 3;
        int64_t margin_ms = 100;
        int64_t max_hold_ms = 10000;
        int64_t default_ms = 1000;
    };
    KvHold() : KvHold(Options{}) {}
    explicit KvHold(Options o) : opt_(o) {}

    void observe(const std::string & tool, int64_t latency_ms);
    //! The hold for one call of `tool`, in ms; 0: park at once.
    int64_t hold_ms(const std::string & tool) const;
    //! The hold for a step that waits on all of `tools` at once: the longest of theirs, or 0 when
    //! any of them gets none.
    int64_t hold_ms(const std::vector<std::string> & tools) const;
    const Options & options() const { return opt_; }

  private:
    Options opt_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, std::deque<int64_t>> seen_;  // guarded by mu_
};

}  // namespace armada::engine

#pragma once

// A session table for one part of the session manager under test (its log, step runner, tool
// runner or placement): it holds the sessions the test makes, and keeps each handler the part asks to run
// later until the test runs it, so a test scripts time instead of sleeping.

#include "agent/session.h"
#include "agent/session_table.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace armada::testing {

//! `Host` is the part's host interface; a test adds the rest of it.
template <class Host>
class ScriptedTable : public Host {
  public:
    std::map<std::string, std::unique_ptr<agent::Session>> sessions;
    std::vector<std::pair<int, std::function<void()>>> timers;  // (ms, handler), run by the test

    void later(int ms, std::function<void()> fn) override { timers.emplace_back(ms, std::move(fn)); }
    agent::Session * session(const std::string & id) override {
        auto it = sessions.find(id);
        return it == sessions.end() ? nullptr : it->second.get();
    }

    //! Runs the handlers queued so far (not those they queue), and returns their delays.
    std::vector<int> run_timers() {
        auto now = std::move(timers);
        timers.clear();
        std::vector<int> ms;
        for (auto & [d, fn] : now) {
            ms.push_back(d);
            fn();
        }
        return ms;
    }
    //! Runs handlers, and those they queue, until none is left.
    void run_all_timers() {
        while (!timers.empty())
            run_timers();
    }
};

}  // namespace armada::testing

#pragma once

// The table that holds a node's sessions, as each part of the session manager (its log, step
// runner, tool runner and placement) sees it. The manager is the table; a test gives a part a
// scripted one.

#include <functional>
#include <string>

namespace armada::agent {

struct Session;

//! Every call is made, and every handler given runs, with the table's lock held (the placement,
//! which reads the store first, takes the lock through its own host before it calls).
class SessionTable {
  public:
    virtual ~SessionTable() = default;
    //! Runs `fn` with the table's lock held after `ms` (0: as soon as it can), unless the table
    //! is gone by then.
    virtual void later(int ms, std::function<void()> fn) = 0;
    //! The session `id` if the table still has it.
    virtual Session * session(const std::string & id) = 0;
};

}  // namespace armada::agent

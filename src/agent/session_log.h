#pragma once

// The session log: what a session writes to the store (its record and steps), in order and one
// batch at a time, and how a session is rebuilt from what was written.

#include "agent/outcome.h"
#include "agent/ports.h"
#include "agent/session_table.h"
#include "obs/metrics.h"
#include "store/store.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace armada::agent {

struct Session;

//! Writes the sessions of one table to the store. Each session's batches go one at a time, in
//! the order they were made; a batch that fails is written again after a jittered pause, and
//! only once it is durable do its steps become events and its `after` run. In cluster mode each
//! batch is fenced by the session's assignment (this node, its epoch), or claims the session
//! with the next epoch; a refused one stops the session here at once.
//!
//! Threads: every method runs with the table's lock held, and so does every handler the log
//! gives its host; the store's callbacks only post.
class SessionLog {
  public:
    //! What the log needs of the table that holds the sessions, beyond `later` and `session`.
    class Host : public SessionTable {
      public:
        //! Runs `fn` without the lock after `ms`, unless the table is gone by then: for calls
        //! that may block.
        virtual void later_unlocked(int ms, std::function<void()> fn) = 0;
        //! The store refused a batch of `s`: another node holds it now (`why`).
        virtual void fenced(Session & s, const std::string & why) = 0;
        //! A batch of `s` is durable and its `after` has run: the host may let it go.
        virtual void written(Session & s) = 0;
    };

    struct Options {
        //! Cluster mode: this node and its cell. Empty on a single node: nothing is fenced.
        std::string node, cell;
    };

    //! `alive` is the table's: false once it is gone, and then no callback reaches it.
    SessionLog(Host & host, store::SessionLog & store, obs::Registry & metrics, const Clock & clock,
               std::shared_ptr<std::atomic<bool>> alive, Options opt);

    //! A session as its record and steps say (every durable step, in order, once); null when
    //! the record's state is unknown. `kv_bytes_per_token` sizes its KV history.
    static std::unique_ptr<Session> rebuild(const store::SessionRecord & r,
                                            const std::vector<store::StepRecord> & steps, uint64_t kv_bytes_per_token);
    //! The session's row as of now.
    store::SessionRecord record(const Session & s) const;
    //! The session's next step, numbered.
    store::StepRecord step(Session & s, const std::string & kind, const std::string & payload,
                           const std::string & key = {});
    //! Writes `b` with the session record (and a state step when the state changed), then runs
    //! `after`; the batch's steps become events once durable. `reply`, if given, answers the
    //! caller waiting for this batch when the session is fenced before it is written (`after`
    //! then never runs).
    void checkpoint(Session & s, store::Batch b, std::function<void(Session &)> after = {},
                    std::function<void(Outcome)> reply = {});
    //! Writes `b` as it is (an empty one confirms the session is still this node's).
    void persist(Session & s, store::Batch b, std::function<void(Session &)> after,
                 std::function<void(Outcome)> reply = {});
    //! Batches that failed and were written again, since the start.
    int64_t failures() const { return failures_.load(); }

  private:
    void send_next(Session & s);
    void on_committed(const std::string & id, store::Status st);

    Host & host_;
    store::SessionLog & store_;  // the store's side of the log: commits and recovery
    obs::Registry & metrics_;
    const Clock & clock_;
    std::shared_ptr<std::atomic<bool>> alive_;
    Options opt_;
    std::atomic<int64_t> failures_{0};
};

}  // namespace armada::agent

#pragma once

// Placement: where a session runs. Resuming after a restart, a brain's assignment (adopt), a
// move offered with its KV, the level-triggered catch-up, and a session fenced by another node.

#include "agent/agent_registry.h"
#include "agent/ports.h"
#include "agent/session_log.h"
#include "agent/session_table.h"
#include "engine/kv_arrival.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "store/store.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace armada::agent {

struct Session;

//! How a session moved here from another node (cluster mode: a drain or a rebalance), recorded
//! as its "moved" step.
using MoveNote = engine::KvArrival;

//! A session this node offers its cell's brain to move now, with its epoch.
struct Movable {
    std::string id;
    int64_t epoch = 0;
    std::optional<obs::TraceContext> trace;  // the trace it is in (`Placement::record_trace`)
    //! The most its KV journal can be, as the move command states it to the node that fetches
    //! it (0: this node holds none of its KV).
    uint64_t kv_bytes = 0;
};

//! Decides which sessions run in one table, from what the store assigns: those left open at the
//! last stop, those a cell's brain assigns here (with or without their KV), and those that moved
//! to another node meanwhile, which stop here. It offers sessions for a move when the node's KV
//! runs short or the node drains.
//!
//! Threads: the store is read without the table's lock, which the placement then takes through
//! its host to look at the table; `drop_fenced` is called with it held. Its own state (the
//! sessions whose KV is on its way) is guarded by that lock too. `adopt_assigned` has one caller
//! thread.
class Placement {
  public:
    //! What the placement needs of the table that holds the sessions, beyond `session`. Unlike
    //! the other parts, it is called without the table's lock, and takes it itself.
    class Host : public SessionTable {
      public:
        //! The table's lock.
        virtual std::unique_lock<std::mutex> lock() = 0;
        //! Every session in the table (lock held).
        virtual std::vector<Session *> all_sessions() = 0;
        //! Whether the node drains: it starts nothing more, and offers every open session (lock
        //! held).
        virtual bool draining() const = 0;
        //! Puts a session rebuilt from the store into the table, in place of the copy it held,
        //! if any (lock held).
        virtual void install(std::unique_ptr<Session> s) = 0;
        //! Takes a session that stops here out of the table, its turn ended: handed on to the
        //! next node when `error` is empty (lock held).
        virtual void drop(Session & s, const std::string & error) = 0;
        //! Continues a session loaded from the store from the state it was left in; it runs here
        //! now (lock held).
        virtual void resume(Session & s) = 0;
    };
    struct Options {
        //! Cluster mode: this node and its cell. Empty on a single node, where only `resume_all`
        //! has work (nothing is assigned, offered or fenced).
        std::string node, cell;
    };
    Placement(Host & host, store::Store & store, GenerationPort & engine, SessionLog & log, AgentRegistry & agents,
              obs::Registry & metrics, const Clock & clock, Options opt);

    //! Loads every session that had not ended and continues it from its last durable step. In
    //! cluster mode, only those assigned to this node. Returns how many were resumed.
    size_t resume_all();
    //! The brain assigned session `id` to this node under `epoch`: load it from the store and
    //! run it from its last checkpoint (see `SessionManager::adopt`).
    bool adopt(const std::string & id, int64_t epoch, std::optional<obs::TraceContext> trace,
               std::optional<MoveNote> moved);
    //! Level-triggered half of `adopt` (see `SessionManager::adopt_assigned`).
    size_t adopt_assigned();
    //! A session on its way here (its KV is being fetched): `adopt_assigned` leaves it alone.
    void incoming(const std::string & id, bool on);
    //! The sessions offered for a move now, with the most their KV journals can be.
    std::vector<Movable> movable();
    //! Up to `n` sessions stop before their next step, to be offered for a move with their KV.
    size_t offer_to_move(size_t n);
    //! Offered sessions still here after `after_ms` go on here, under the next epoch.
    size_t stay_unmoved(int64_t after_ms);
    //! Open sessions the store assigns to this node; nullopt when the store cannot be read.
    std::optional<size_t> open_here();
    //! Whether the store gives the open session to another node; nullopt when it cannot be read.
    std::optional<bool> held_elsewhere(const std::string & id);
    //! Another node holds the session now: stop it here without writing anything more (lock
    //! held).
    void drop_fenced(Session & s, const std::string & why);
    //! Sessions stopped because another node holds them now.
    size_t fenced() const { return fenced_.load(); }

  private:
    //! The sessions `movable` offers, without their KV sizes.
    std::vector<Movable> movable_sessions();
    //! Stops the open sessions running here that the store gives to another node (this one was
    //! stopped or cut off past its lease, and they moved on). Idle ones would otherwise never
    //! write, never be fenced, and stay counted in this node's load. `assigned`: the open
    //! sessions the store lists for this node.
    void drop_moved(const std::set<std::string> & assigned);
    //! True when session `id` is in the table and runs here; it then writes under `epoch` if that
    //! is newer (lock held).
    bool running_here(const std::string & id, int64_t epoch);
    //! The session runs here from now on: the host continues it.
    void go_on(Session & s);
    //! A session read from the store, ready to go into the table: null when it cannot be
    //! rebuilt.
    std::unique_ptr<Session> rebuilt(const store::SessionRecord & r, const std::vector<store::StepRecord> & steps,
                                     int64_t epoch);

    Host & host_;
    store::Store & store_;
    GenerationPort & engine_;
    SessionLog & log_;
    AgentRegistry & agents_;
    obs::Registry & metrics_;
    const Clock & clock_;
    Options opt_;
    std::set<std::string> incoming_;  // KV being fetched (`incoming`); the table's lock
    //! Assignments `adopt_assigned` found not running here at its last call, by epoch.
    std::map<std::string, int64_t> unrun_assigned_;
    bool adopt_scanned_ = false;
    std::atomic<size_t> fenced_{0};
};

}  // namespace armada::agent

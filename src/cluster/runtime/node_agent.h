#pragma once

// A node's part in its cell, around the sessions it runs: it takes the cell brain's run commands
// (a placement, a failover, a move whose KV it fetches first), tells the brain what happened here
// (a session ended, the node drains, a session may move), and adopts what the store assigns it.
// It talks only to seams (Bus and Inbox, KvStore, Clock, and NodeSessions for the sessions), so
// `armada serve --cluster`, the unit tests and the simulator run the same code. The node's lease
// (NodeMembership) is wired beside it.

#include "cluster/runtime/bus.h"
#include "cluster/runtime/clock.h"
#include "cluster/runtime/keys.h"
#include "cluster/runtime/kv.h"
#include "engine/kv_arrival.h"
#include "obs/trace.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace armada::cluster {

//! Node → brain events (armada.event.<cell>) waiting to be published: a session that ended here,
//! the node starting to drain, a session that may move. Filled from any thread without blocking
//! (the session manager calls it under its lock); the agent's publisher sends them. Bounded: they
//! are hints that make the brain act sooner, and its reconcile finds the same facts in the store
//! and etcd.
class NodeEvents {
  public:
    explicit NodeEvents(std::string node) : node_(std::move(node)) {}
    //! {"op":"ended","session","node","state"}, deduplicated by session in the stream.
    void ended(const std::string & session, const std::string & state);
    //! {"op":"draining","node"}.
    void draining();
    //! {"op":"movable","session","node","epoch"[,"traceparent"][,"kv_bytes"]}: draining or past
    //! its KV watermark, the node has the session between steps, so the brain may move it with its
    //! KV (its `migrate` span goes in the session's trace), whose journal is at most kv_bytes.
    //! Repeated every few seconds while it stays.
    void movable(const std::string & session, int64_t epoch, const std::string & traceparent, uint64_t kv_bytes,
                 int64_t now_ms);
    //! The next event (data, message id), waiting up to `wait_ms`; false when none came.
    bool pop(std::pair<std::string, std::string> & out, int wait_ms);
    uint64_t dropped() const { return dropped_.load(); }

  private:
    void push(std::string data, std::string msg_id);
    static constexpr size_t kMax = 10000;
    std::string node_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::pair<std::string, std::string>> q_;  // (data, msg id)
    std::atomic<uint64_t> dropped_{0};
};

//! How a session came here from another node.
using Arrived = engine::KvArrival;

//! The sessions of a node, as its agent drives them (the SessionManager in a process).
class NodeSessions {
  public:
    virtual ~NodeSessions() = default;
    //! Runs `id` here under `epoch` (false: the epoch is stale); `moved` says how it came.
    virtual bool adopt(const std::string & id, int64_t epoch, const std::optional<obs::TraceContext> & trace,
                       const std::optional<Arrived> & moved) = 0;
    //! Runs every open session the store assigns here that does not run yet.
    virtual void adopt_assigned() = 0;
    //! A session whose KV is on its way here (`on`), or no longer.
    virtual void incoming(const std::string & id, bool on) = 0;
    struct Movable {
        std::string id;
        int64_t epoch = 0;
        std::optional<obs::TraceContext> trace;
        uint64_t kv_bytes = 0;
    };
    //! Sessions this node offers its brain to move now (between steps).
    virtual std::vector<Movable> movable() = 0;
    //! Up to `n` sessions stop before their next step, to be offered (a rebalance).
    virtual void offer_to_move(size_t n) = 0;
    //! Offered sessions still here after `after_ms` go on here.
    virtual void stay_unmoved(int64_t after_ms) = 0;
};

struct NodeAgentConfig {
    std::string prefix = "/armada";
    std::string cell, node;
    int command_wait_ms = 500;  // how long one fetch waits for a command
    int fetchers = 2;           // threads fetching moved sessions' KV
    uint64_t seed = 0;          // its back-offs' random draws (0: from the system)
};

class NodeAgent {
  public:
    //! Fetches a moving session's KV from the node that had it (`from`, answering at `url`; ""
    //! when it is gone) and installs it here; never more than `stated` bytes (0: not stated).
    using FetchKv = std::function<Arrived(const std::string & session, const std::string & from,
                                          const std::string & url, uint64_t stated)>;
    //! The URL of `node` of this cell while it is a live member ("" with `why` otherwise).
    using MemberUrl = std::function<std::string(const std::string & node, std::string & why)>;

    NodeAgent(NodeAgentConfig cfg, KvStore & kv, Bus & bus, Inbox & commands, NodeSessions & sessions,
              std::shared_ptr<NodeEvents> events, Clock & clock, FetchKv fetch_kv = {}, MemberUrl member_url = {});
    ~NodeAgent();
    NodeAgent(const NodeAgent &) = delete;
    NodeAgent & operator=(const NodeAgent &) = delete;

    //! Runs the turns below on threads of its own until `stop`.
    void start();
    void stop();

    //! One pass of the command loop: offers and the store's assignments when due, then the
    //! commands waiting (up to `wait_ms` for the first).
    void command_turn(int wait_ms);
    //! Sends the next queued event (waiting up to `wait_ms`); false when none was queued.
    bool event_turn(int wait_ms, bool last_try = false);
    //! Adopts the next session that arrived with a move (its KV fetched first), waiting for one
    //! when `wait`; false when none came (or on a stop).
    bool arrival_turn(bool wait = true);

    uint64_t commands() const { return commands_.load(); }
    void set_draining() { draining_ = true; }
    void set_kv_high(std::function<bool()> f) { kv_high_ = std::move(f); }
    int arriving() const { return arriving_.load(); }
    std::set<std::string> offered() const;
    //! Other nodes of the cell that take work; nullopt when the key-value store cannot be read.
    std::optional<size_t> peers_taking_work() const;

  private:
    struct Arrival {
        std::string session, from;
        int64_t epoch = 0;
        std::optional<obs::TraceContext> trace;
        uint64_t kv_bytes = 0;
    };
    void offer_movable();
    void run(const std::string & data);

    NodeAgentConfig cfg_;
    ClusterKeys keys_;
    KvStore & kv_;
    Bus & bus_;
    Inbox & commands_in_;
    NodeSessions & sessions_;
    std::shared_ptr<NodeEvents> events_;
    Clock & clock_;
    FetchKv fetch_kv_;
    MemberUrl member_url_;
    std::function<bool()> kv_high_;
    uint64_t draws_;  // the next event retry's back-off seed

    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> commands_{0};
    std::atomic<bool> draining_{false};
    std::atomic<int> arriving_{0};
    int64_t last_offer_ = 0, last_check_ = 0;
    bool commands_idle_ = true;  // the last fetch found no command waiting
    mutable std::mutex offered_mu_;
    std::set<std::string> offered_;  // guarded by offered_mu_
    std::mutex arrivals_mu_;
    std::condition_variable arrivals_cv_;
    std::deque<Arrival> arrivals_;  // guarded by arrivals_mu_
    std::thread commands_thread_, events_thread_;
    std::vector<std::thread> fetchers_;
};

}  // namespace armada::cluster

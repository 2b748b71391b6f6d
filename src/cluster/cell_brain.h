#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/rollout.h"
#include "cluster/string_map.h"

namespace armada::cluster {

//! What a node reports about itself, about once a second.
struct NodeLoad {
    std::string node;
    int free_seqs = 0;                            // sequence slots not in use
    int64_t kv_headroom = 0;                      // bytes of KV budget left
    int64_t kv_budget = 0;                        // bytes of KV it may hold in all (0: not reported)
    int sessions = 0;                             // sessions it runs
    std::map<std::string, int> by_state;          // of those, how many in each state
    std::map<std::string, int64_t> kv_by_tenant;  // KV bytes their sessions hold in memory, by tenant
    int engines = 0;                              // engine instances (NUMA nodes it serves from)
    int cores = 0;                                // compute threads over its engines
    double step_ms = 0;                           // recent model-step latency; 0: not known
    int64_t ctx = 0;                              // tokens one sequence holds (prompt + output); 0: not known
    std::string version;                          // Armada version
    std::string fingerprint;                      // model fingerprint (KV compatibility)
    bool draining = false;
    std::string url;      // where its HTTP API answers, for gateways
    NodeSignals signals;  // counts since the process started, for rollouts' gates
    //! The report's number, counting from a random start in each node process: the same report
    //! read again (a reconcile re-reads etcd) is not news. 0: not numbered.
    int64_t seq = 0;
    bool operator==(const NodeLoad &) const = default;
};

//! A decision: run `session` on `node` under `epoch` (greater than any it had). `moved` is set
//! when the session had a node before (a re-placement after a failure, or a move). `from` is set
//! when that node is alive and has the session between steps (it drains): the new node fetches
//! the session's KV from it.
struct Place {
    std::string session;
    std::string node;
    int64_t epoch = 0;
    bool moved = false;
    std::string from;  // a live node to fetch its KV from (an offered move); "" otherwise
    std::string left;  // the node it was on, live or dead (moved only)
    bool operator==(const Place &) const = default;
};

struct CellBrainConfig {
    //! A load report older than this is not trusted for placement (the node may be hung).
    int64_t report_ttl_ms = 5000;
    //! Rebalancing: a node takes a session offered by a node that does not drain only with at
    //! least this share of its KV budget free, and `kv_margin` more than the offering node.
    double kv_room = 0.30;
    double kv_margin = 0.20;
    //! Re-placements (sessions whose node died) are paced by a token bucket, so a lost node
    //! does not turn into a stampede on the others: this many per second, bursts up to `burst`.
    double moves_per_s = 200;
    double burst = 100;
    //! A placement younger than this when a report arrives is taken to be missing from it (its
    //! run command may still be on the way), so the node's free sequences still count it.
    int64_t settle_ms = 1000;
};

//! The cell brain's decision code: events in, decisions out. No I/O, clock, thread or socket:
//! the caller passes the time, the adapters (etcd, NATS, PostgreSQL) feed it events and carry
//! out its decisions, and the simulator drives the same class.
//!
//! It keeps a session on its node while that node's lease lives; places new sessions and those
//! of dead nodes on the live, non-draining node with the most free sequences (then the most KV
//! headroom), counting what it placed since that node's last report; never on a node whose lease
//! is gone or whose report is stale. Level-triggered: `reconcile` replaces the whole view (a new
//! leader, or the periodic check), and `decide` derives decisions from the view alone, so a lost
//! or repeated event is corrected at the next reconcile.
class CellBrain {
  public:
    explicit CellBrain(CellBrainConfig cfg = {}) : cfg_(cfg) {}

    // --- events ---
    //! A node's lease appeared (it joined) or is still there.
    void node_up(const std::string & node);
    //! A node's lease expired or was revoked: its sessions need another node.
    void node_down(const std::string & node);
    void load(const NodeLoad & l, int64_t now_ms);
    //! A node said it drains (an event, ahead of its next report): nothing more goes to it until
    //! a report says otherwise.
    void node_draining(const std::string & node);
    //! A node has the session between steps under `epoch` and offers it: it moves to another
    //! node, which takes its KV along (paced like re-placements). A node offers sessions when it
    //! drains, or when its KV is past its high watermark: a rebalance, which goes only to a node
    //! with KV room (see CellBrainConfig), else the offer lapses and the session stays. Ignored
    //! unless the session is still the node's own at that epoch.
    void session_movable(const std::string & id, const std::string & node, int64_t epoch);
    //! A session the cell must run, with its current assignment ("" and 0 when never placed).
    void session_open(const std::string & id, const std::string & node, int64_t epoch);
    //! A session ended (or left the cell): nothing more to place.
    void session_closed(const std::string & id);
    //! A decision was carried out: the assignment is durable.
    void place_done(const std::string & id);
    //! Carrying out a decision failed (the store refused the assignment: someone moved it first).
    //! The session is left alone until the next reconcile says where it is.
    void place_failed(const std::string & id);
    //! The whole truth, from etcd (live nodes) and PostgreSQL (open sessions with assignments).
    //! Load reports of nodes still live are kept.
    struct OpenSession {
        std::string id, node;
        int64_t epoch = 0;
    };
    void reconcile(const std::set<std::string> & live_nodes, const std::vector<OpenSession> & open);

    // --- decisions ---
    //! Placements to carry out now. Each is applied to the view at once (optimistically); a
    //! failed one is reported back with `place_failed`.
    std::vector<Place> decide(int64_t now_ms);

    // --- views, for metrics and tests ---
    size_t waiting() const;                         // open sessions with no live node
    size_t queued() const { return todo_.size(); }  // of those, the ones to place when there is room
    size_t sessions_on(const std::string & node) const;
    bool live(const std::string & node) const { return nodes_.count(node) > 0; }
    std::vector<std::string> live_nodes() const;
    std::optional<std::string> node_of(const std::string & session) const;
    //! The fresh reports of live nodes (what the cell's aggregate sums).
    std::vector<NodeLoad> loads(int64_t now_ms) const;

  private:
    struct Node {
        std::optional<NodeLoad> load;
        int64_t reported_ms = 0;
        std::vector<int64_t> pending;  // when sessions were given to it that its report may not show
    };
    struct Session {
        std::string node;
        int64_t epoch = 0;
        bool held = false;        // a decision failed: wait for reconcile
        bool confirming = false;  // a decision is being carried out: the store may not show it yet
        bool evacuate = false;    // its draining node offered it (`session_movable`): move it
        uint64_t order = 0;       // arrival, for first-come placement
        uint64_t seen = 0;        // the reconcile that last found it in the store
    };
    //! The node for the next placement; `from` (a move's source) is never picked, and only a
    //! node with at least `min_kv_free` of its KV budget free is.
    const std::string * pick(int64_t now_ms, const std::string * from = nullptr, double min_kv_free = 0) const;
    bool draining(const std::string & node) const;
    //! The share of its KV budget its last report shows free (1 when it reports none).
    double kv_free(const std::string & node) const;
    //! Keeps `todo_` right for one session after any change to it or to its node's liveness.
    void index(const std::string & id, const Session & s);
    //! Re-indexes the sessions assigned to `node` (it joined or left).
    void index_node(const std::string & node);
    //! Every change of a session's node goes through here, so `assigned_` stays right.
    void assign(Session & s, const std::string & node);

    //! Open sessions this brain has on each node (placed by it or read from the store). A node
    //! whose report shows fewer has not taken the rest yet (their run commands are late, as in a
    //! NATS outage): they count against its free sequences however old the placement is.
    std::unordered_map<std::string, int> assigned_;
    //! Where each session being placed (`confirming`) was before, so a placement that fails
    //! stops counting against the node it was never written to.
    std::unordered_map<std::string, std::string> placing_from_;

    CellBrainConfig cfg_;
    std::map<std::string, Node> nodes_;  // live nodes (lease held)
    StringMap<Session> sessions_;        // open sessions (order: `Session::order`)
    //! The sessions `decide` looks at (no live node, no decision pending or held), by arrival:
    //! it costs what there is to place, not what the cell runs.
    std::set<std::pair<uint64_t, std::string>> todo_;
    double tokens_ = -1;  // re-placement bucket; -1: not started
    int64_t tokens_at_ms_ = 0;
    uint64_t order_ = 0;
    uint64_t generation_ = 0;  // reconciles so far
};

}  // namespace armada::cluster

#pragma once

// The loop around a cell's brain while it leads: its view rebuilt from the truth (live nodes in
// the key-value store, open sessions in the session store), node events and place requests taken
// from the bus, the brain's decisions written as fenced assignments and sent to the nodes as run
// commands, and the cell's report. It talks only to seams (KvStore, Bus and Inbox, store::Store,
// Clock, Leadership), so the process, the unit tests and the simulator run the same code.

#include "cluster/cell_brain.h"
#include "cluster/global_brain.h"
#include "cluster/runtime/bus.h"
#include "cluster/runtime/clock.h"
#include "cluster/runtime/informer.h"
#include "cluster/runtime/keys.h"
#include "cluster/runtime/kv.h"
#include "cluster/runtime/leadership.h"
#include "common/backoff.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "store/store.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace armada::cluster {

struct CellRunnerConfig {
    std::string cell;
    std::string prefix = "/armada";  // the cluster's etcd prefix
    int reconcile_ms = 3000;         // the view rebuilt from the truth this often
    int check_ms = 1000;             // leadership checked, report written, this often
    int fetch_wait_ms = 50;          // how long one turn waits for place requests
    uint64_t seed = 0;               // its back-offs' random draws (0: from the system)
};

class CellRunner {
  public:
    CellRunner(CellRunnerConfig cfg, KvStore & kv, Bus & bus, Inbox & places, Inbox & events, store::Store & store,
               Clock & clock, obs::Registry & metrics);
    ~CellRunner();
    CellRunner(const CellRunner &) = delete;
    CellRunner & operator=(const CellRunner &) = delete;

    //! Leads until the term ends (a newer leader, a lost election) or a stop.
    void lead(Leadership & term);

    //! The same in steps, for a caller that owns the loop (the simulator, tests): `begin` on
    //! taking the lead (false: it cannot lead after all), `turn` once per pass (false: the term
    //! is over), `end` on leaving it.
    bool begin(Leadership & term);
    bool turn(Leadership & term);
    void end();

    //! Sessions placed or moved since the process started.
    uint64_t placed() const { return placed_; }
    //! Reconciles made, and how many failed (a dependency away).
    int64_t reconciles() const { return reconciles_; }
    int64_t reconcile_failures() const { return reconcile_failures_; }
    //! The brain while leading (null otherwise), for tests and the simulator's checks.
    const CellBrain * brain() const { return brain_.get(); }

  private:
    bool reconcile();
    void apply_node_changes(const std::vector<EtcdEvent> & changes, int64_t now);
    void node_left(const std::string & name);
    bool read_failovers();
    void keep_failovers(const EtcdLeader & me);
    void report(Leadership & term, int64_t now);
    void take_events();
    bool take_places(Leadership & term);
    //! Writes and sends the brain's decisions; false when a newer leader has written.
    bool place(Leadership & term);
    std::vector<store::Status> assign(const std::vector<Place> & decisions);
    void count_decisions(const std::vector<Place> & decisions, const std::vector<store::Status> & results,
                         std::chrono::steady_clock::time_point since);

    CellRunnerConfig cfg_;
    ClusterKeys keys_;
    KvStore & kv_;
    Bus & bus_;
    Inbox & places_;
    Inbox & events_;
    store::Store & store_;
    Clock & clock_;
    obs::Registry & metrics_;

    // While leading.
    std::unique_ptr<CellBrain> brain_;
    std::unique_ptr<Informer> nodes_;
    bool nodes_ok_ = false;  // the last look at the node list succeeded
    store::Batch::Leadership leader_;
    int64_t last_reconcile_ = -1, last_check_ = 0, retry_at_ = 0;
    common::Backoff backoff_{250, 4000, cfg_.seed ? cfg_.seed + 1 : std::random_device{}()};
    //! The trace context each place request came with, and when it was taken (for its span).
    std::map<std::string, std::pair<obs::TraceContext, int64_t>> traces_;

    uint64_t placed_ = 0;
    int64_t reconciles_ = 0, reconcile_failures_ = 0;
    int64_t survival_at_ = 0;               // when the survival gauges were last read (wall ms)
    std::map<std::string, int> by_tenant_;  // open sessions per tenant, at the last reconcile
    //! The trace each open session is in, from its row at the last reconcile and from its node's
    //! `movable` events since: a session's `migrate` span goes in it.
    std::unordered_map<std::string, obs::TraceContext> session_traces_;
    //! What each offered session's node stated as the most its KV journal is: node, bytes.
    std::unordered_map<std::string, std::pair<std::string, uint64_t>> session_kv_bytes_;
    std::map<std::string, int64_t> ended_;  // the survival window's outcomes, as last read
    //! Nodes lost with sessions on them, latest last; kept across leaderships of this process
    //! (a new leader elsewhere starts with none).
    std::vector<CellReport::Failover> failovers_;
    bool failovers_dirty_ = false, failovers_read_ = false;
};

}  // namespace armada::cluster

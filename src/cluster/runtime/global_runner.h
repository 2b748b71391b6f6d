#pragma once

// The loop around the global brain while it leads: the cells' reports (from the key-value store
// and the bus), their node leases, re-homes of a lost cell's open sessions written fenced and
// sent to their new cells, the split of new sessions for gateways, a rollout's turns, and the
// figures (chain survival, etcd's size). It talks only to seams (KvStore, Bus, store::Store,
// Clock, Leadership, NodeRestarter), so the process, the unit tests and the simulator run the
// same code.

#include "cluster/global_brain.h"
#include "cluster/restarter.h"
#include "cluster/rollout.h"
#include "cluster/runtime/bus.h"
#include "cluster/runtime/clock.h"
#include "cluster/runtime/informer.h"
#include "cluster/runtime/keys.h"
#include "cluster/runtime/kv.h"
#include "cluster/runtime/leadership.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "store/store.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace armada::cluster {

struct GlobalRunnerConfig {
    std::string prefix = "/armada";
    std::vector<CellSpec> cells;  // empty: the cells are learnt from their reports
    int tick_ms = 1000;           // how often cells are read and lost ones handed over
    int shares_ms = 5000;         // how often the split of new sessions is written
    int lease_ttl_s = 10;         // the cluster's lease TTL (a report path's freshness window)
    int64_t etcd_status_ms = 10000;
    //! The cells read afresh this often (watched in between: a watch over a connection that died
    //! without a word would keep an old view).
    int64_t relist_ms = 5000;
    uint64_t seed = 0;  // its back-offs' random draws (0: from the system)
};

class GlobalRunner {
  public:
    //! `restarter` may be null: a rollout then halts at once, saying `restarter_error` (or that
    //! there is no restarter).
    GlobalRunner(GlobalRunnerConfig cfg, KvStore & kv, Bus & bus, store::Store & store, Clock & clock,
                 obs::Registry & metrics, NodeRestarter * restarter = nullptr, std::string restarter_error = {});
    ~GlobalRunner();
    GlobalRunner(const GlobalRunner &) = delete;
    GlobalRunner & operator=(const GlobalRunner &) = delete;

    //! Leads until the term ends or a stop, a turn every `tick_ms`.
    void lead(Leadership & term);
    //! The same in steps (the simulator, tests).
    bool begin(Leadership & term);
    bool turn(Leadership & term);
    void end();

    const GlobalBrain * brain() const { return brain_.get(); }
    //! Sessions re-homed (written) since the process started.
    int64_t rehomed() const { return rehomed_; }

  private:
    //! The cells as the key-value store shows them.
    struct Seen {
        std::map<std::string, CellReport> reports;
        std::map<std::string, int64_t> report_rev;  // each report's mod_revision
        std::set<std::string> alive;                // cells with any key
        std::map<std::string, int> live_nodes;      // node keys per cell
        std::vector<FleetNode> nodes;               // live nodes, as their load reports show them
    };
    bool look(Seen & out);
    std::map<std::string, CellReport> pushed();
    void note_paths(const std::string & cell, bool etcd, bool nats);
    void carry_out(Leadership & term, const std::vector<Rehome> & decisions);
    void rollout_turn(Leadership & term, const Seen & seen);
    void write_shares(int64_t t);

    GlobalRunnerConfig cfg_;
    ClusterKeys keys_;
    KvStore & kv_;
    Bus & bus_;
    store::Store & store_;
    Clock & clock_;
    obs::Registry & metrics_;
    NodeRestarter * restarter_;
    std::string restarter_error_;

    // While leading.
    std::unique_ptr<GlobalBrain> brain_;
    std::unique_ptr<Informer> cells_;
    std::unique_ptr<Listener> reports_;
    std::set<std::string> known_, was_lost_, was_silent_;
    store::Batch::Leadership leader_;
    bool deposed_ = false;
    bool heard_ = false;  // a report has come since this brain leads: its split is worth writing
    std::string last_shares_;
    std::set<std::string> last_full_;
    std::map<std::string, std::map<std::string, int64_t>> ended_;  // cell → its report's ended, by outcome
    int64_t subscribe_at_ = 0, last_shares_ms_ = 0, last_written_ms_ = 0, last_check_ = 0, survival_at_ = 0,
            last_etcd_status_ = 0;
    std::map<std::string, int64_t> last_pushed_;   // cell → when its last bus report came
    std::map<std::string, int64_t> last_written_;  // cell → when its stored report last changed
    std::map<std::string, int64_t> report_rev_;    // cell → its stored report's last mod_revision
    std::map<std::string, int> paths_;             // cell → the paths last logged (bit 1 etcd, 2 NATS)
    std::optional<Rollout> rollout_;               // the rollout under way, while leading
    std::map<std::string, int64_t> asked_;         // node → the restart gen asked for
    int64_t state_written_ms_ = 0;
    int64_t rehomed_ = 0;
    //! The trace each open session of a lost cell is in (from its row): its re-home's `migrate`
    //! span goes in it.
    std::unordered_map<std::string, obs::TraceContext> traces_;
};

}  // namespace armada::cluster

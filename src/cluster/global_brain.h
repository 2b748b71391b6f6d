#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cluster/cell_brain.h"

namespace armada::cluster {

//! A cell's aggregate, written by its leading brain every few seconds: what the global brain
//! splits new sessions by.
struct CellReport {
    std::string cell;
    int nodes = 0;
    int cores = 0;
    int capacity = 0;         // session slots over its live, non-draining nodes (free + used)
    int free_seqs = 0;        // of those, free
    int64_t kv_headroom = 0;  // bytes
    int64_t kv_budget = 0;    // bytes of KV its nodes may hold (0: not reported)
    int live_sessions = 0;
    int queued = 0;                        // open sessions its brain has yet to place (no room on its nodes now)
    double step_ms = 0;                    // recent model-step latency (p50); 0: not known
    std::map<std::string, int> by_tenant;  // live sessions per tenant
    std::string leader;                    // the brain that wrote the report (its --name)
    //! Sessions of the cell that ended in the survival window, by outcome (completed, failed,
    //! timed_out, lost, cancelled); empty until its brain has read them.
    std::map<std::string, int64_t> ended;
    //! A node the cell lost (its lease went while it held sessions), as its brain saw it.
    struct Failover {
        int64_t at_ms = 0;  // wall clock, ms since the epoch
        std::string node;
        int sessions = 0;  // that it held, to move
        bool operator==(const Failover &) const = default;
    };
    std::vector<Failover> failovers;  // the latest last, at most kMaxFailovers
    static constexpr size_t kMaxFailovers = 20;
};

//! A cell's aggregate from its live nodes' fresh reports (`CellBrain::loads`) and its open
//! sessions per tenant: what its leading brain writes, and the simulator's cells too.
CellReport cell_report(const std::string & cell, const std::vector<NodeLoad> & loads,
                       const std::map<std::string, int> & by_tenant, int queued = 0);

//! A cell as the config declares it.
struct CellSpec {
    std::string name;
    std::string domain;  // fault domain (rack, room); cells of one domain may fail together
    //! Share of its capacity a cell may fill before it gets no new sessions (the sources plan at
    //! about 57% of the measured peak).
    double water = 0.57;
};

struct GlobalBrainConfig {
    //! A cell whose aggregate is older than this is lost (its brains are gone or cut off).
    int64_t report_ttl_ms = 15000;
    //! Re-homing of a lost cell's sessions is paced by a token bucket for each cell that takes
    //! them: each takes this many per second, bursts up to `burst`. A lost cell cannot stampede
    //! any one cell, and a big cluster absorbs it in proportion to its size.
    double rehomes_per_s = 100;
    double burst = 200;
};

//! How gateways split new sessions: weights over the cells that take them, and for each tenant
//! with live sessions the cell its new ones go to while that cell is under water.
struct Shares {
    std::map<std::string, double> weight;            // sums to 1; empty: no cell takes sessions
    std::map<std::string, std::string> tenant_home;  // tenant → cell
    //! Cells that report and are at or above their water level: no new session goes there, even
    //! when no cell has a weight.
    std::set<std::string> full;
    bool operator==(const Shares &) const = default;
};

//! A decision: move `session` from the lost cell `from` to `to` under `epoch` (greater than the
//! one it had), for `to`'s brain to place.
struct Rehome {
    std::string session, from, to;
    int64_t epoch = 0;
    bool operator==(const Rehome &) const = default;
};

//! The cell for a new session of `tenant`: its home while there is one, else a weighted
//! rendezvous hash of the tenant over the weights, so every gateway picks the same cell for a
//! tenant new to the cluster and its later sessions follow. Empty when no cell takes sessions.
std::string pick_cell(const Shares & s, const std::string & tenant);

//! The global brain's decision code: events in, decisions out, no I/O, clock or thread, like the
//! CellBrain. Level-triggered: `report` and `open_in` replace what was known of a cell.
class GlobalBrain {
  public:
    explicit GlobalBrain(std::vector<CellSpec> cells, GlobalBrainConfig cfg = {});

    //! A cell not in the config, found running (defaults for the rest).
    void add_cell(CellSpec spec);

    // --- events ---
    //! A cell's aggregate; a lost cell that reports again is back.
    void report(const CellReport & r, int64_t now_ms);
    //! The adapter saw every lease of the cell (brains and nodes) gone: lost at once, without
    //! waiting for its reports to go stale.
    void leases_gone(const std::string & cell);
    //! How many of the cell's nodes hold a live lease, as etcd showed the adapter. A cell whose
    //! reports stopped while some of its nodes live is silent, not lost: its brains are stuck or
    //! cut off, but its sessions still run where they are, so none is re-homed (it gets no new
    //! sessions either). Until this is called for a cell, reports alone decide.
    void node_leases(const std::string & cell, int live);
    //! The open sessions still homed in `cell` (read from PostgreSQL once it is lost), with the
    //! tenant and epoch of each. Replaces what was known; an empty list means it is emptied.
    struct OpenSession {
        std::string id, tenant;
        int64_t epoch = 0;
    };
    void open_in(const std::string & cell, const std::vector<OpenSession> & open);
    //! A re-home was written (done) or refused (someone moved it first): either way it leaves.
    void rehome_done(const std::string & session);

    // --- decisions ---
    //! The split of new sessions now.
    Shares shares(int64_t now_ms) const;
    //! Re-homes to carry out now, paced and within the other cells' capacity (the headroom above
    //! their water level is there for this).
    std::vector<Rehome> decide(int64_t now_ms);

    // --- views ---
    //! Its sessions are to be re-homed: every lease gone, or reports stale with no live node.
    bool lost(const std::string & cell, int64_t now_ms) const;
    //! Its reports are stale (lost or silent): it takes no new sessions.
    bool stale(const std::string & cell, int64_t now_ms) const;
    //! Lost cells whose sessions the adapter should read (open_in) and hand over.
    std::vector<std::string> lost_cells(int64_t now_ms) const;
    size_t waiting() const;  // sessions of lost cells not yet re-homed

  private:
    struct Cell {
        CellSpec spec;
        std::optional<CellReport> last;
        int64_t reported_ms = 0;
        bool gone = false;                        // leases gone, until it reports again
        int live_nodes = -1;                      // nodes with a live lease; -1: not known
        int taken = 0;                            // sessions sent to it since its last report
        std::map<std::string, OpenSession> open;  // while lost: its sessions to re-home
        std::set<std::string> in_flight;          // re-homes decided, not yet written
        double tokens = -1;                       // re-homes it may take now; -1: not started
    };
    //! Sessions it may still take before its water level (0 when lost, draining, or full).
    int room(const Cell & c, int64_t now_ms) const;
    //! Sessions it may still take up to its capacity: a lost cell's sessions go into the headroom
    //! the water level keeps for them (0 when lost or under KV pressure).
    int spare(const Cell & c, int64_t now_ms) const;
    std::string target(const Cell & from, const std::string & tenant, int64_t now_ms) const;

    GlobalBrainConfig cfg_;
    std::map<std::string, Cell> cells_;
    int64_t tokens_at_ms_ = -1;
};

}  // namespace armada::cluster

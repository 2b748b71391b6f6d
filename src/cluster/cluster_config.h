#pragma once

#include "cluster/etcd.h"
#include "cluster/rollout.h"
#include "cluster/service_auth.h"
#include "routing/rules.h"

#include <optional>
#include <string>
#include <vector>

namespace armada::cluster {

//! Where a cluster's servers are, and its timings: one YAML file every process of the cluster
//! reads (`--cluster FILE`).
//!
//!     etcd: [10.0.0.1:2379, 10.0.0.2:2379, 10.0.0.3:2379]
//!     nats: nats://10.0.0.4:4222
//!     redis: 10.0.0.5:6379
//!     postgres: [postgres://armada@10.0.0.6/armada_0, postgres://armada@10.0.0.7/armada_1]
//!     lease_ttl_s: 5
//! A cell as the cluster file declares it (`cells:`), for the global brain.
struct CellConfig {
    std::string name;
    std::string domain;   // fault domain: cells that may fail together (a rack, a room)
    double water = 0.57;  // share of its capacity it may fill before it gets no new sessions
};

//! `rollout:` in the cluster file: what `armada rollout start` uses for each flag it is not
//! given. The defaults are the flags' own.
struct RolloutDefaults {
    double wave_percent = 5;
    int max_per_cell = 1;
    int settle_s = 120;
    int watch_before_s = -1;  // -1: the settle time, at most 60 s
    int ready_timeout_s = 600;
    double restarts_per_s = 2;
    RolloutGates gates;
};

struct ClusterConfig {
    std::vector<std::string> etcd;      // host:port of each member
    std::string nats;                   // nats://host:port
    std::string redis;                  // host:port
    std::vector<std::string> postgres;  // one URL per shard
    std::string prefix = "/armada";     // etcd key prefix (several clusters can share an etcd)
    int lease_ttl_s = 5;                // a process whose lease is not renewed for this long is gone
    int report_ms = 1000;               // how often a node reports its load
    int pg_pool = 8;                    // PostgreSQL read connections per shard, per process
    int redis_pool = 8;
    ServiceCredentials redis_auth, nats_auth, etcd_auth;  // `credentials:`; empty: none
    ServiceCredentials postgres_auth;                     // TLS files only (passwords: a passfile)
    ServiceCredentials nodes_auth;                        // TLS files only: how gateways and nodes check a node's HTTPS
    std::vector<CellConfig> cells;   // empty: the global brain takes the cells it finds, with defaults
    routing::RoutingConfig routing;  // GPU pools and the rules that send requests there (pools.h)
    RolloutDefaults rollout;
};

//! A client of the cluster's etcd, with its credentials (`credentials: etcd:`) when it has some.
EtcdClient make_etcd(const ClusterConfig & c, int timeout_ms = 5000);

//! Reads and checks the file; nullopt with `error` naming the field that is wrong.
std::optional<ClusterConfig> load_cluster_config(const std::string & path, std::string & error);
//! `load_cluster_config` for a brain or gateway: etcd, NATS and PostgreSQL must be named too.
//! The error names the file.
std::optional<ClusterConfig> load_cluster_config_for_service(const std::string & path, std::string & error);
//! The same from YAML text (tests, `cluster up`).
std::optional<ClusterConfig> parse_cluster_config(const std::string & yaml, std::string & error);

//! etcd keys.
std::string node_key(const ClusterConfig & c, const std::string & cell, const std::string & node);
std::string nodes_prefix(const ClusterConfig & c, const std::string & cell);
std::string brain_election(const ClusterConfig & c, const std::string & cell);
//! A cell's aggregate report, written by its leading brain under its lease.
std::string cell_report_key(const ClusterConfig & c, const std::string & cell);
//! A cell's recent failovers, kept without a lease so that the next leader of the cell has them.
std::string cell_failovers_key(const ClusterConfig & c, const std::string & cell);
std::string cells_prefix(const ClusterConfig & c);
std::string global_election(const ClusterConfig & c);
//! The global brain's split of new sessions (no lease: it outlives a global leader).
std::string shares_key(const ClusterConfig & c);
//! Live gateways, each under its lease (they divide tenant quotas among them without Redis).
std::string gateways_prefix(const ClusterConfig & c);
//! Cell and node names: 1..63 of [A-Za-z0-9._-] (they become etcd keys and NATS subjects).
bool valid_cell_or_node_name(const std::string & s);

}  // namespace armada::cluster

#pragma once

#include "api/http_server.h"
#include "engine/engine.h"
#include "engine/topology.h"

#include <optional>

#include <string>
#include <vector>

namespace armada::cli {

//! Everything `armada serve` takes from flags and ARMADA_* variables.
//! Placement flags (engine/topology.h) as given, resolved against the machine at start.
struct PlacementFlags {
    std::string numa = "auto";
    std::string cpus;        // Linux cpu list; empty: all the process may use
    std::string numa_nodes;  // list of node numbers; empty: all
    bool smt = false;
    int engines = 0;  // 0: one per NUMA node (auto) or one
};

struct ServeOptions {
    std::string model;
    engine::EngineConfig engine;
    api::HttpConfig http;
    std::string api_key;
    std::string api_key_file;
    std::string log_level = "info";
    std::string agents_file;
    std::string data_dir = "./armada-data";
    std::string state;  // "" or "sqlite": SQLite in data_dir; postgres://…[,postgres://…]: PostgreSQL shards
    int pg_pool = 8;    // read connections per PostgreSQL shard
    std::vector<std::string> tool_allow;  // CIDRs tools may reach despite the SSRF guard
    std::string kv_budget;                // size text, e.g. "8G"; empty: automatic
    std::string kv_disk = "64G";
    bool no_park = false;
    //! A session's KV stays in its sequence across a tool call for as long as that tool usually
    //! takes, up to this; a tool that usually takes longer gets no hold. 0: no holds.
    int64_t kv_hold_max_ms = 10000;
    bool no_kv_journal = false;
    bool no_prefix_cache = false;
    PlacementFlags place;
    bool no_pin = false;
    std::string cache_type_k = "f16";
    std::string cache_type_v = "f16";
    std::string numa_weights = "shared";  // shared: one mapped copy; copy: one private copy per memory node
    double rate_rpm = 0;                  // per API key; 0: unlimited
    double rate_tpm = 0;
    // Operations
    std::string metrics_host = "127.0.0.1";  // Prometheus listener, no key needed
    int metrics_port = -1;                   // -1: none; 0: any free port
    double drain_timeout_s = 30;             // SIGTERM: how long running work may take to finish
    std::string session_ttl = "30d";         // ended sessions and stored responses are deleted after
    std::string tool_ca_file;                // a CA added to the system store for https tools
    int mcp_workers = 64;                    // threads for calls to MCP servers
    int mcp_per_tenant = 4;                  // MCP calls one tenant may have running
    int tool_per_tenant = 64;                // HTTP tool calls one tenant may have in flight
    int mcp_discover_ms = 10000;             // budget for listing a server's tools
    // Cluster mode (armada serve --cluster FILE --cell C)
    std::string pools_file;    // GPU pools for heavy agent steps (a single node; see routing/rules.h)
    std::string cluster_file;  // the cluster's servers and timings; empty: a single node
    std::string cell;
    std::string node_name;       // default: this host's name and port
    std::string advertise;       // the URL gateways reach this node at; default http://HOST:PORT
    int cluster_sessions = 256;  // sessions this node takes from its cell brain
    //! Share of the KV budget in use past which the node offers sessions to move, with their KV,
    //! to nodes with room (a rebalance); 0 turns it off.
    double kv_rebalance_at = 0.9;
    //! The version this node reports to its cell (rollouts go by it); empty: ARMADA_VERSION.
    std::string version_label;
    //! Tests only: a finished model step fails with this probability (a bad build, for rollouts).
    double test_step_errors = 0;
};

//! "30d", "12h", "90m", "45s", or a number of seconds; "0" is forever. Milliseconds, or nullopt.
std::optional<int64_t> parse_duration_ms(const std::string & text);

//! Placement options from the flags' text. Returns nullopt and sets `err` on a malformed list.
std::optional<engine::PlacementOptions> placement_options(const PlacementFlags & f, std::string & err);

//! `armada topology`: prints the topology (this machine, or an hwloc synthetic description or
//! XML file) and the placement plan. Returns the process exit code.
int topology_command(const std::string & synthetic, const std::string & xml, const PlacementFlags & f);

//! Runs the node until SIGINT/SIGTERM. Returns the process exit code.
int serve(const ServeOptions & opt);

}  // namespace armada::cli

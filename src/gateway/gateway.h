#pragma once

#include "api/http_server.h"

#include <string>

namespace armada::gateway {

struct GatewayOptions {
    std::string cluster_file;
    api::HttpConfig http;
    std::string api_key;
    std::string api_key_file;
    std::string cell;  // where new sessions go; "" picks the cell with the most room
    std::string name;  // among the live gateways in etcd; "" is HOST-PORT
    std::string log_level = "info";
    int affinity_ttl_s = 600;
    //! Worker threads alive at once: each request (and each open event stream) holds one while it
    //! runs. Beyond it a request gets 503 and Retry-After.
    size_t max_workers = 1024;
    //! A tenant's concurrent session event streams through this gateway; beyond it, 429.
    size_t max_streams_per_tenant = 256;
    //! Reads (GET, DELETE, event streams opened) a key may make a minute, shared by the gateways
    //! as rpm is; beyond it, 429. Admin keys are not counted. 0: no limit.
    int64_t reads_per_minute = 6000;
};

//! `armada gateway`: the single entry of a cluster, with the API of a node. It checks API keys as a
//! node does, writes new sessions to PostgreSQL and asks their cell to place them, and forwards
//! everything else to a node: a session's requests and event stream to the node holding it
//! (following it when it moves, with Last-Event-ID), chat completions by prompt-prefix affinity,
//! the rest by load. Tenants and their keys live in PostgreSQL (its /admin API); their quotas are
//! enforced with the other gateways through Redis. It keeps no state of its own: run as many as
//! needed. Runs until
//! SIGINT/SIGTERM; returns the exit code.
int gateway_command(const GatewayOptions & o);

}  // namespace armada::gateway

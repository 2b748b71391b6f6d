#pragma once

// The cluster's store as its processes see it: the session log and the cluster's queries
// (`Store`) and the directory of tenants and keys (`Directory`), on PostgreSQL. The gateway, the
// brains and cluster nodes open it here and never name the PostgreSQL class
// (store/postgres_store.h), which only store/ includes.

#include "store/directory.h"
#include "store/store.h"

#include <memory>
#include <string>
#include <vector>

namespace armada::store {

struct PostgresConfig {
    //! One connection string per shard (`postgres://user@host:port/db`); sessions, their steps
    //! and responses are spread over them by a hash of their id, agents live on the first.
    std::vector<std::string> urls;
    int read_connections = 4;  // per shard, opened and checked at start
    int pool_wait_ms = 5000;   // a read waits at most this long for a free connection
    int connect_timeout_s = 5;
    //! The server ends any statement that runs longer (statement_timeout), and the client gives
    //! up `client_grace_ms` after that on a server that does not answer at all (0: no limits).
    int statement_timeout_ms = 10000;
    //! A brain sets both from its lease TTL, so that a call to a server that hangs returns before
    //! the brain's own stall check gives its lead up.
    int client_grace_ms = 2000;
};

class ClusterStore : public Store, public Directory {};

//! Opens the cluster's store on PostgreSQL (its schema migrated, its read pools checked); null
//! with `error` when it cannot.
std::unique_ptr<ClusterStore> open_cluster_store(const PostgresConfig & cfg, std::string & error);

}  // namespace armada::store

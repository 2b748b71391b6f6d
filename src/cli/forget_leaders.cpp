#include "cli/cluster_up.h"
#include "cluster/cluster_config.h"
#include "common/cli_exit.h"
#include "store/cluster_store.h"

#include <fmt/format.h>

#include <cstdio>

namespace armada::cli {

int forget_leaders(const std::string & cluster_file) {
    std::string err;
    auto cfg = cluster::load_cluster_config(cluster_file, err);
    if (!cfg) {
        return common::fail(err, 2);
    }
    if (cfg->postgres.empty()) {
        return common::fail(fmt::format("{} names no PostgreSQL database (postgres:)", cluster_file), 2);
    }
    store::PostgresConfig pc;
    pc.urls = cfg->postgres;
    pc.read_connections = 1;
    auto st = store::open_cluster_store(pc, err);
    if (!st) {
        return common::fail(fmt::format("PostgreSQL: {}", err));
    }
    store::Batch b;
    b.probe = true;  // a part for every shard
    b.forget_leaders = true;
    if (const store::Status s = st->commit_sync(std::move(b)); !s.ok) {
        return common::fail(fmt::format("PostgreSQL: {}", s.error));
    }
    printf("armada: the leader marks are gone from %zu PostgreSQL shard(s); each brain's next leader writes its own\n",
           cfg->postgres.size());
    return 0;
}

}  // namespace armada::cli

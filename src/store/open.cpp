#include "store/open.h"

#include "store/postgres_store.h"
#include "store/sqlite_store.h"

#include <algorithm>

namespace armada::store {

std::vector<std::string> postgres_urls(const std::string & state) {
    std::vector<std::string> urls;
    if (state.rfind("postgres://", 0) != 0 && state.rfind("postgresql://", 0) != 0) return urls;
    for (size_t at = 0; at <= state.size();) {
        const size_t comma = std::min(state.find(',', at), state.size());
        if (comma > at) urls.push_back(state.substr(at, comma - at));
        at = comma + 1;
    }
    return urls;
}

std::unique_ptr<ClusterStore> open_cluster_store(const PostgresConfig & cfg, std::string & error) {
    return PostgresStore::open(cfg, error);
}

std::unique_ptr<Store> open(const std::string & state, const OpenOptions & o, std::string & error) {
    if (state.empty() || state == "sqlite") return SqliteStore::open(o.data_dir, error);
    if (auto urls = postgres_urls(state); !urls.empty()) {
        PostgresConfig pc;
        pc.urls = std::move(urls);
        pc.read_connections = o.pg_pool;
        return PostgresStore::open(pc, error);
    }
    error = "the state store must be sqlite or postgres://… (a comma-separated list shards sessions)";
    return nullptr;
}

}  // namespace armada::store

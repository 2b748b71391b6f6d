#pragma once

// One way to open a store from what a user wrote (`--state`): the backend is chosen by the
// address.

#include "store/store.h"

#include <memory>
#include <string>
#include <vector>

namespace armada::store {

struct OpenOptions {
    std::string data_dir;  // SQLite: where `armada.db` lives
    int pg_pool = 4;       // PostgreSQL: read connections per shard
};

//! The PostgreSQL URLs in `state` ("postgres://…" or "postgresql://…", a comma-separated list
//! shards sessions over them); empty when `state` names no PostgreSQL.
std::vector<std::string> postgres_urls(const std::string & state);

//! "" or "sqlite": SQLite in `o.data_dir`; PostgreSQL URLs: PostgreSQL. Anything else, or a store
//! that cannot open, is null with `error` saying why.
std::unique_ptr<Store> open(const std::string & state, const OpenOptions & o, std::string & error);

}  // namespace armada::store

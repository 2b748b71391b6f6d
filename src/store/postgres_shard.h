#pragma once

// What a PostgresStore keeps per shard (its writer, its queue, its read pool) and a read
// connection borrowed from that pool: shared by the store's reads and its writer (inside store/
// only).

#include "store/pg_conn.h"
#include "store/postgres_store.h"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace armada::store {

struct PostgresStore::Shard {
    size_t index = 0;
    std::string url;
    int query_timeout_ms = 0;  // the most any statement waits for the server (run)
    // The writer's connection: used by the writer thread, and by `recover` under `wmu`.
    PGconn * wconn = nullptr;
    std::mutex wmu;

    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<Batch, std::function<void(Status)>>> queue;  // guarded by mu
    bool stop = false;                                                // guarded by mu
    std::string sticky;                                               // guarded by mu
    std::thread writer;

    // The read pool.
    mutable std::mutex pmu;
    std::condition_variable pcv;
    std::vector<PGconn *> all, free;  // guarded by pmu
    PoolStats stats;                  // guarded by pmu

    ~Shard() {
        for (PGconn * c : all)
            PQfinish(c);
        if (wconn) PQfinish(wconn);
    }
};

//! A read connection taken from a shard's pool, given back when it goes.
class PostgresStore::Lease {
  public:
    Lease(Shard * s, PGconn * c) : s_(s), c_(c) {}
    Lease(Lease && o) noexcept : s_(o.s_), c_(o.c_) { o.c_ = nullptr; }
    Lease(const Lease &) = delete;
    ~Lease() {
        if (!c_) return;
        {
            std::lock_guard lk(s_->pmu);
            s_->free.push_back(c_);
            s_->stats.in_use--;
        }
        s_->pcv.notify_one();
    }
    PGconn * get() const { return c_; }
    explicit operator bool() const { return c_ != nullptr; }
    //! Runs a read, reconnecting once if the server went away since the connection was used.
    pg::Res query(const std::string & sql, const std::vector<std::string> & params = {}) {
        pg::Res r = pg::run(c_, sql, params, s_->query_timeout_ms);
        if (!r.ok() && r.failure.empty() && PQstatus(c_) == CONNECTION_BAD) {
            PQreset(c_);
            {
                std::lock_guard lk(s_->pmu);
                s_->stats.reconnects++;
            }
            if (PQstatus(c_) == CONNECTION_OK) r = pg::run(c_, sql, params, s_->query_timeout_ms);
        }
        if (!r.ok()) spdlog::warn("postgres shard {}: read failed: {}", s_->index, pg::error_of(c_, r));
        return r;
    }

  private:
    Shard * s_;
    PGconn * c_;
};

}  // namespace armada::store

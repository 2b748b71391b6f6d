// How many step commits one PostgreSQL shard takes a second: the figure docs/SCALE.md divides
// the reference load by to count the shards it needs. Each commit is what a node writes after a
// step: the step's entry, fenced by the session's node and epoch. Writers keep commits in flight
// as a node's sessions do, and the store's writer groups them into transactions.
//
// In `make test` it runs 2 s and checks only that every commit was acknowledged. The measurement:
//   ARMADA_RATE_S=30 ARMADA_RATE_SESSIONS=20000 ./tests/armada_cluster_tests --gtest_filter='StoreRate.*'
#include "cluster/local_servers.h"
#include "servers.h"
#include "store/postgres_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>

using namespace armada;

namespace {
long env_long(const char * name, long fallback) {
    const char * v = std::getenv(name);
    return v && *v ? std::atol(v) : fallback;
}
}  // namespace

TEST(StoreRate, StepCommitsOfOneShardAreAllAcknowledged) {
    const long seconds = env_long("ARMADA_RATE_S", 2), sessions = env_long("ARMADA_RATE_SESSIONS", 2000);
    const long in_flight = env_long("ARMADA_RATE_IN_FLIGHT", 512);
    cluster::LocalPostgres pg;
    ASSERT_EQ(pg.start(servers().root + "/pg-rate"), "");
    ASSERT_EQ(pg.create_database("rate"), "");
    store::PostgresConfig pc;
    pc.urls = {pg.url("rate")};
    pc.read_connections = 1;
    std::string err;
    auto st = store::PostgresStore::open(pc, err);
    ASSERT_TRUE(st) << err;
    // The sessions, each held by a node at epoch 1.
    for (long first = 0; first < sessions; first += 1000) {
        store::Batch b;
        for (long i = first; i < std::min(sessions, first + 1000); ++i) {
            store::SessionRecord r;
            r.id = "s" + std::to_string(i);
            r.agent_id = "worker";
            r.owner = "t";
            r.state = "running";
            r.cell = "c1";
            b.sessions.push_back(r);
            b.assign.push_back({r.id, "n" + std::to_string(i % 64), 1});
        }
        ASSERT_TRUE(st->commit_sync(std::move(b)).ok);
    }
    std::mutex mu;
    std::condition_variable cv;
    long flying = 0, acked = 0, failed = 0;
    std::string first_error;
    std::vector<int64_t> next_seq(size_t(sessions), 1);
    const auto t0 = std::chrono::steady_clock::now();
    const auto until = t0 + std::chrono::seconds(seconds);
    long sent = 0;
    while (std::chrono::steady_clock::now() < until) {
        {
            std::unique_lock lk(mu);
            cv.wait(lk, [&] { return flying < in_flight; });
            ++flying;
        }
        const long i = sent++ % sessions;
        store::Batch b;
        store::StepRecord s;
        s.session_id = "s" + std::to_string(i);
        s.seq = next_seq[size_t(i)]++;
        s.kind = "tool_result";
        s.payload =
            R"({"call":"lookup","result":"a short tool result of about a hundred bytes, as agents' tools give"})";
        s.idempotency = s.session_id + ":" + std::to_string(s.seq);
        b.steps.push_back(s);
        b.fences.push_back({s.session_id, "n" + std::to_string(i % 64), 1});
        st->commit(std::move(b), [&](store::Status r) {
            std::lock_guard lk(mu);
            --flying;
            if (r.ok) {
                ++acked;
            } else {
                ++failed;
                if (first_error.empty()) first_error = r.error;
            }
            cv.notify_all();
        });
    }
    {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return flying == 0; });
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(failed, 0) << first_error;
    EXPECT_EQ(acked, sent);
    EXPECT_EQ(st->steps("s0").size(), size_t(next_seq[0] - 1)) << "each acknowledged step is in the log";
    std::printf("one shard: %ld step commits in %.1f s = %.0f a second (%ld sessions, %ld in flight)\n", acked, took,
                double(acked) / took, sessions, in_flight);
}

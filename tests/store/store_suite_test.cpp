// One suite for every store: each test runs against SQLite and against PostgreSQL (a real server
// from the Debian binaries, started once for the run by the same helper `armada cluster up` uses).
#include "cluster/local_servers.h"
#include "store/memory_store.h"
#include "store/postgres_store.h"
#include "store/sqlite_store.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <future>
#include <random>
#include <set>
#include <thread>
#include <tuple>

using namespace armada;
using namespace armada::store;
namespace fs = std::filesystem;

namespace {

cluster::LocalPostgres * g_pg = nullptr;
std::string g_root;

class Servers : public ::testing::Environment {
  public:
    void SetUp() override {
        g_root = (fs::temp_directory_path() / ("armada-stores-" + std::to_string(::getpid()))).string();
        fs::create_directories(g_root);
        g_pg = new cluster::LocalPostgres();
        const std::string e = g_pg->start(g_root + "/pg");
        ASSERT_EQ(e, "") << "PostgreSQL for the store suite";
    }
    void TearDown() override {
        delete g_pg;  // fast shutdown of the server this process started
        g_pg = nullptr;
        std::error_code ec;
        fs::remove_all(g_root, ec);
    }
};
const auto * g_env = ::testing::AddGlobalTestEnvironment(new Servers);

int g_db = 0;

//! A fresh, empty store of the kind under test; `shards` databases for PostgreSQL.
struct Fixture {
    std::string kind;
    std::string dir;
    std::vector<std::string> urls;

    std::unique_ptr<Store> open(std::string & err) const {
        if (kind == "sqlite") return SqliteStore::open(dir, err);
        if (kind == "memory") return std::make_unique<MemoryStore>();
        PostgresConfig c;
        c.urls = urls;
        c.read_connections = 2;
        return PostgresStore::open(c, err);
    }
};

Fixture fresh(const std::string & kind, int shards = 1) {
    Fixture f;
    f.kind = kind;
    const int n = ++g_db;
    if (kind == "sqlite") {
        f.dir = g_root + "/sqlite-" + std::to_string(n);
    } else {
        for (int i = 0; i < shards; ++i) {
            const std::string db = "t" + std::to_string(n) + "_" + std::to_string(i);
            EXPECT_EQ(g_pg->create_database(db), "");
            f.urls.push_back(g_pg->url(db));
        }
    }
    return f;
}

SessionRecord session(const std::string & id, const std::string & state = "running") {
    SessionRecord r;
    r.id = id;
    r.agent_id = "agent";
    r.owner = "tenant-a";
    r.state = state;
    r.data = "{}";
    r.created_ms = 1000;
    r.updated_ms = 1000;
    return r;
}

StepRecord step(const std::string & id, int64_t seq, const std::string & payload = "{}") {
    StepRecord s;
    s.session_id = id;
    s.seq = seq;
    s.kind = "model_output";
    s.payload = payload;
    s.ts_ms = 1000 + seq;
    return s;
}

Batch fenced_step(const std::string & id, int64_t seq, const std::string & node, int64_t epoch) {
    Batch b;
    b.steps.push_back(step(id, seq));
    b.fences.push_back({id, node, epoch});
    return b;
}

Batch assign(const std::string & id, const std::string & node, int64_t epoch) {
    Batch b;
    b.assign.push_back({id, node, epoch});
    return b;
}

class StoreSuite : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        fx = fresh(GetParam());
        std::string err;
        store = fx.open(err);
        ASSERT_TRUE(store) << err;
    }
    Fixture fx;
    std::unique_ptr<Store> store;
};

TEST_P(StoreSuite, AcknowledgedStepsReadBackInOrder) {
    Batch b;
    b.sessions.push_back(session("s1"));
    for (int i = 1; i <= 5; ++i)
        b.steps.push_back(step("s1", i, "{\"n\":" + std::to_string(i) + ",\"text\":\"héllo\"}"));
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    auto r = store->session("s1");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->owner, "tenant-a");
    EXPECT_EQ(r->state, "running");
    const auto steps = store->steps("s1");
    ASSERT_EQ(steps.size(), 5u);
    for (int i = 0; i < 5; ++i)
        EXPECT_EQ(steps[size_t(i)].seq, i + 1);
    EXPECT_EQ(steps[2].payload, "{\"n\":3,\"text\":\"héllo\"}");
    EXPECT_FALSE(store->session("nope"));
    EXPECT_TRUE(store->steps("nope").empty());
}

TEST_P(StoreSuite, AgentsSessionsAndResponsesHaveTablesOfTheirOwn) {
    Batch b;
    b.sessions.push_back(session("s1"));
    b.agents.push_back({"tenant-a", "helper", "{\"model\":\"m\"}", "[]", 1, 1});
    b.responses.push_back({"resp_1", "tenant-a", "{\"response\":{}}", 5000});
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    auto resp = store->response("resp_1");
    ASSERT_TRUE(resp);
    EXPECT_EQ(resp->tenant, "tenant-a");
    EXPECT_EQ(resp->data, "{\"response\":{}}");
    EXPECT_FALSE(store->session("resp_1"));  // a response is not a session row
    EXPECT_FALSE(store->response("s1"));
    const auto live = store->sessions_not_in({"completed"});
    ASSERT_EQ(live.size(), 1u);
    EXPECT_EQ(live[0].id, "s1");
    const auto agents = store->agents();
    ASSERT_TRUE(agents);
    ASSERT_EQ(agents->size(), 1u);
    EXPECT_EQ((*agents)[0].id, "helper");
    EXPECT_EQ(store->expired_responses(5001, 10), std::vector<std::string>{"resp_1"});  // retention
    EXPECT_TRUE(store->expired_responses(5000, 10).empty());

    Batch del;
    del.erase_responses.push_back("resp_1");
    del.erase_agents.push_back({"tenant-a", "helper"});
    ASSERT_TRUE(store->commit_sync(std::move(del)).ok);
    EXPECT_FALSE(store->response("resp_1"));
    ASSERT_TRUE(store->agents());
    EXPECT_TRUE(store->agents()->empty());  // read, and empty: not a failed read
}

TEST_P(StoreSuite, ATenantsSessionsListNewestFirstWithoutOtherTenantsOrStoredAgents) {
    Batch b;
    for (int i = 0; i < 5; ++i) {
        SessionRecord r = session("a" + std::to_string(i), i % 2 ? "completed" : "running");
        r.created_ms = 1000 + i;
        b.sessions.push_back(r);
    }
    SessionRecord other = session("b0");
    other.owner = "tenant-b";
    b.sessions.push_back(other);
    SessionRecord stored = session("@agent:x");
    stored.agent_id = "@agent";  // a stored agent's row, not a session
    b.sessions.push_back(stored);
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    const auto all = store->sessions_of("tenant-a", "", 10);
    ASSERT_TRUE(all);
    std::vector<std::string> ids;
    for (const auto & r : *all)
        ids.push_back(r.id);
    EXPECT_EQ(ids, (std::vector<std::string>{"a4", "a3", "a2", "a1", "a0"}));
    const auto done = store->sessions_of("tenant-a", "completed", 10);
    ASSERT_TRUE(done);
    ASSERT_EQ(done->size(), 2u);
    EXPECT_EQ((*done)[0].id, "a3");
    const auto two = store->sessions_of("tenant-a", "", 2);
    ASSERT_TRUE(two);
    ASSERT_EQ(two->size(), 2u);
    EXPECT_EQ((*two)[1].id, "a3");
    const auto b_only = store->sessions_of("tenant-b", "", 10);
    ASSERT_TRUE(b_only);
    ASSERT_EQ(b_only->size(), 1u);
    EXPECT_EQ((*b_only)[0].id, "b0");
}

TEST_P(StoreSuite, ATenantsOpenSessionsLeaveOutEndedOnesOtherTenantsAndStoredAgents) {
    // What a gateway counts against a tenant's live-sessions quota (PostgreSQL's own query; the
    // interface's default on the other stores).
    Batch b;
    for (int i = 0; i < 4; ++i)
        b.sessions.push_back(session("a" + std::to_string(i), i % 2 ? "completed" : "running"));
    b.sessions.push_back(session("a4", "failed"));
    SessionRecord other = session("b0");
    other.owner = "tenant-b";
    b.sessions.push_back(other);
    SessionRecord stored = session("@agent:y");
    stored.agent_id = "@agent";
    b.sessions.push_back(stored);
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    auto open = store->open_ids_of("tenant-a", {"completed", "failed", "cancelled"});
    ASSERT_TRUE(open);
    std::sort(open->begin(), open->end());
    EXPECT_EQ(*open, (std::vector<std::string>{"a0", "a2"}));
    open = store->open_ids_of("tenant-b", {"completed", "failed", "cancelled"});
    ASSERT_TRUE(open);
    EXPECT_EQ(*open, (std::vector<std::string>{"b0"}));
}

TEST_P(StoreSuite, AnUpsertLeavesTheAssignmentAlone) {
    Batch b;
    b.sessions.push_back(session("s1"));
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    ASSERT_TRUE(store->commit_sync(assign("s1", "node-1", 1)).ok);
    Batch up;
    up.sessions.push_back(session("s1", "waiting_user"));
    ASSERT_TRUE(store->commit_sync(std::move(up)).ok);
    auto r = store->session("s1");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->state, "waiting_user");
    EXPECT_EQ(r->node, "node-1");
    EXPECT_EQ(r->epoch, 1);
}

TEST_P(StoreSuite, TheCellIsKeptFromTheFirstWriteAndSelectsOpenSessions) {
    // Three open sessions in two cells, one ended; a later upsert names no cell.
    Batch b;
    for (const auto & [id, cell, state] : {std::tuple{"a", "c1", "running"}, std::tuple{"b", "c1", "waiting_tool"},
                                           std::tuple{"c", "c2", "running"}, std::tuple{"d", "c1", "completed"}}) {
        SessionRecord r = session(id, state);
        r.cell = cell;
        b.sessions.push_back(r);
    }
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    ASSERT_TRUE(store->commit_sync(assign("a", "n1", 1)).ok);
    ASSERT_TRUE(store->commit_sync(assign("b", "n2", 1)).ok);
    Batch up;
    up.sessions.push_back(session("a", "waiting_input"));  // no cell: the row keeps c1
    ASSERT_TRUE(store->commit_sync(std::move(up)).ok);
    EXPECT_EQ(store->session("a")->cell, "c1");
    const std::vector<std::string> ended = {"completed", "failed", "cancelled"};
    auto ids = [](const std::optional<std::vector<SessionRecord>> & v) {
        std::set<std::string> s;
        EXPECT_TRUE(v.has_value());
        for (const auto & r : v.value_or(std::vector<SessionRecord>{}))
            s.insert(r.id);
        return s;
    };
    EXPECT_EQ(ids(store->open_sessions("c1", "", ended)), (std::set<std::string>{"a", "b"}));
    EXPECT_EQ(ids(store->open_sessions("c1", "n2", ended)), (std::set<std::string>{"b"}));
    EXPECT_EQ(ids(store->open_sessions("c2", "", ended)), (std::set<std::string>{"c"}));
    const auto none = store->open_sessions("c3", "", ended);
    ASSERT_TRUE(none);  // read, and empty: not a failed read
    EXPECT_TRUE(none->empty());
}

TEST_P(StoreSuite, AReHomeMovesASessionToAnotherCellUnderAHigherEpoch) {
    Batch b;
    SessionRecord r = session("s1", "running");
    r.cell = "c1";
    b.sessions.push_back(r);
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    ASSERT_TRUE(store->commit_sync(assign("s1", "n1", 1)).ok);
    // The global brain moves it out of its lost cell: no node until c2's brain places it.
    Batch move;
    move.assign.push_back({"s1", "", 2, "c2"});
    ASSERT_TRUE(store->commit_sync(std::move(move)).ok);
    const std::vector<std::string> ended = {"completed", "failed", "cancelled"};
    ASSERT_TRUE(store->open_sessions("c1", "", ended));
    EXPECT_TRUE(store->open_sessions("c1", "", ended)->empty());
    const auto open = store->open_sessions("c2", "", ended).value_or(std::vector<SessionRecord>{});
    ASSERT_EQ(open.size(), 1u);
    EXPECT_EQ(open[0].id, "s1");
    EXPECT_EQ(open[0].node, "");
    EXPECT_EQ(open[0].epoch, 2);
    // The old node's next write is fenced; the same re-home again is refused; c2's brain places it.
    EXPECT_TRUE(store->commit_sync(fenced_step("s1", 2, "n1", 1)).fenced);
    Batch again;
    again.assign.push_back({"s1", "", 2, "c3"});
    EXPECT_TRUE(store->commit_sync(std::move(again)).fenced);
    ASSERT_TRUE(store->commit_sync(assign("s1", "n7", 3)).ok);
    EXPECT_EQ(store->session("s1")->cell, "c2");
    EXPECT_EQ(store->session("s1")->node, "n7");
}

TEST_P(StoreSuite, AWriteFromAnOldEpochIsFencedAndLeavesNothing) {
    Batch b;
    b.sessions.push_back(session("s1"));
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    ASSERT_TRUE(store->commit_sync(assign("s1", "node-1", 1)).ok);
    ASSERT_TRUE(store->commit_sync(fenced_step("s1", 1, "node-1", 1)).ok);
    // The session moves: node-1's next write is refused, and says why.
    ASSERT_TRUE(store->commit_sync(assign("s1", "node-2", 2)).ok);
    Batch stale = fenced_step("s1", 2, "node-1", 1);
    stale.sessions.push_back(session("s1", "stale"));
    const Status st = store->commit_sync(std::move(stale));
    EXPECT_FALSE(st.ok);
    EXPECT_TRUE(st.fenced);
    EXPECT_NE(st.error.find("no longer held by node-1"), std::string::npos) << st.error;
    EXPECT_EQ(store->steps("s1").size(), 1u);
    EXPECT_EQ(store->session("s1")->state, "running");
    // A fence is not a store failure: the store stays writable, and the new owner writes.
    EXPECT_TRUE(store->writable().ok);
    EXPECT_TRUE(store->commit_sync(fenced_step("s1", 2, "node-2", 2)).ok);
    EXPECT_EQ(store->steps("s1").size(), 2u);
}

TEST_P(StoreSuite, AnAssignmentNeverGoesBackwards) {
    Batch b;
    b.sessions.push_back(session("s1"));
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    ASSERT_TRUE(store->commit_sync(assign("s1", "node-2", 2)).ok);
    const Status late = store->commit_sync(assign("s1", "node-1", 1));  // a late, older decision
    EXPECT_TRUE(late.fenced) << late.error;
    EXPECT_FALSE(late.deposed);
    const Status again = store->commit_sync(assign("s1", "node-2", 2));  // a repeated one
    EXPECT_TRUE(again.fenced) << again.error;
    EXPECT_EQ(store->session("s1")->node, "node-2");
    EXPECT_EQ(store->session("s1")->epoch, 2);
    EXPECT_TRUE(store->commit_sync(assign("nope", "node-1", 1)).fenced);
}

Batch led(Batch b, const std::string & election, int64_t rev) {
    b.leader = {election, rev};
    return b;
}

TEST_P(StoreSuite, ABrainWhoseSuccessorWroteIsRefusedWhateverItWrites) {
    Batch b;
    b.sessions.push_back(session("s1"));
    b.sessions.push_back(session("s2"));
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    // The leader elected at revision 10 places s1.
    ASSERT_TRUE(store->commit_sync(led(assign("s1", "node-1", 1), "cell0", 10)).ok);
    ASSERT_TRUE(store->commit_sync(led(assign("s1", "node-1", 2), "cell0", 10)).ok);  // its mark again
    // Its successor (revision 20) writes; the old one, paused through the election, then wakes
    // and places a session nobody has placed: refused, nothing written.
    ASSERT_TRUE(store->commit_sync(led(assign("s1", "node-2", 3), "cell0", 20)).ok);
    const Status late = store->commit_sync(led(assign("s2", "node-1", 1), "cell0", 10));
    EXPECT_FALSE(late.ok);
    EXPECT_TRUE(late.fenced);
    EXPECT_TRUE(late.deposed);  // the brain stops leading on this, not on an epoch fence
    EXPECT_NE(late.error.find("newer leader of cell0"), std::string::npos) << late.error;
    EXPECT_EQ(store->session("s2")->epoch, 0);
    EXPECT_TRUE(store->session("s2")->node.empty());
    EXPECT_TRUE(store->writable().ok);
    // Another election is another mark; a batch without a leader is not a brain's.
    EXPECT_TRUE(store->commit_sync(led(assign("s2", "node-1", 1), "global", 5)).ok);
    EXPECT_TRUE(store->commit_sync(assign("s2", "node-1", 2)).ok);
    EXPECT_TRUE(store->commit_sync(led(assign("s2", "node-3", 3), "cell0", 20)).ok);
    EXPECT_EQ(store->session("s2")->node, "node-3");
}

TEST_P(StoreSuite, BatchesQueuedTogetherShareOneCommit) {
    if (GetParam() == "memory") GTEST_SKIP() << "the in-memory store commits each batch at once: nothing to group";
    {
        Batch b;
        b.sessions.push_back(session("g"));
        ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    }
    // Each callback runs on the writer thread once its transaction committed, and reads how many
    // batches that transaction carried.
    auto group = [&]() -> size_t {
        if (fx.kind == "sqlite") return static_cast<SqliteStore &>(*store).last_group_size();
        return static_cast<PostgresStore &>(*store).last_group_size();
    };
    std::vector<size_t> sizes(200, 0);
    std::vector<std::future<Status>> got;
    for (int i = 1; i <= 200; ++i) {
        auto p = std::make_shared<std::promise<Status>>();
        got.push_back(p->get_future());
        Batch b;
        b.steps.push_back(step("g", i));
        store->commit(std::move(b), [p, i, &sizes, &group](Status s) {
            sizes[size_t(i - 1)] = group();
            p->set_value(s);
        });
    }
    for (auto & f : got)
        ASSERT_TRUE(f.get().ok);
    EXPECT_EQ(store->steps("g").size(), 200u);
    // 200 commits queued faster than one fsync: fewer transactions than batches, so at least one
    // carried several (one at a time would give 1 everywhere).
    EXPECT_GT(*std::max_element(sizes.begin(), sizes.end()), 1u);
    std::set<size_t> distinct(sizes.begin(), sizes.end());
    EXPECT_FALSE(distinct.count(0)) << "every batch was acknowledged after a commit";
}

TEST_P(StoreSuite, InAGroupCommitOnlyTheFencedBatchIsRefused) {
    for (const char * id : {"a", "b"}) {
        Batch b;
        b.sessions.push_back(session(id));
        b.assign.push_back({id, "node-1", 1});
        ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    }
    ASSERT_TRUE(store->commit_sync(assign("b", "node-2", 2)).ok);
    // Many batches queued at once: whatever groups the writer forms, only b's are fenced.
    std::vector<std::future<Status>> got;
    for (int i = 1; i <= 40; ++i) {
        auto p = std::make_shared<std::promise<Status>>();
        got.push_back(p->get_future());
        const bool for_b = i % 4 == 0;
        store->commit(fenced_step(for_b ? "b" : "a", for_b ? i / 4 : i, "node-1", 1),
                      [p](Status s) { p->set_value(s); });
    }
    size_t ok = 0, fenced = 0;
    for (auto & f : got) {
        const Status s = f.get();
        ok += s.ok;
        fenced += s.fenced;
    }
    EXPECT_EQ(ok, 30u);
    EXPECT_EQ(fenced, 10u);
    EXPECT_EQ(store->steps("a").size(), 30u);
    EXPECT_TRUE(store->steps("b").empty());
    EXPECT_TRUE(store->writable().ok);
}

// Two writers on one database, as a partitioned node and the brain that moved its session are:
// once the move is acknowledged, no write of the old owner is, and every acknowledged step is
// there.
TEST_P(StoreSuite, AMoveRacingTheOldOwnersWritesNeverForksTheLog) {
    if (GetParam() == "memory") GTEST_SKIP() << "two clients of one database: the in-memory store has one client";
    Batch b;
    b.sessions.push_back(session("s1"));
    b.assign.push_back({"s1", "node-1", 1});
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    std::string err;
    auto brain = fx.open(err);
    ASSERT_TRUE(brain) << err;
    std::atomic<bool> moved{false};
    std::atomic<int> acked_after_move{0};
    int acked = 0;
    bool stopped_by_fence = false;
    std::thread node([&] {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        for (int seq = 1; std::chrono::steady_clock::now() < until; ++seq) {
            const bool was_moved = moved.load();
            const Status s = store->commit_sync(fenced_step("s1", seq, "node-1", 1));
            if (s.fenced) {
                stopped_by_fence = true;
                break;
            }
            ASSERT_TRUE(s.ok) << s.error;
            ++acked;
            if (was_moved) ++acked_after_move;
            // A node has other sessions to run between two steps of this one (SQLite's lock
            // would otherwise rarely let the other writer in).
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(brain->commit_sync(assign("s1", "node-2", 2)).ok);
    moved = true;
    node.join();
    EXPECT_EQ(acked_after_move.load(), 0);
    EXPECT_TRUE(stopped_by_fence);
    EXPECT_GT(acked, 0);
    EXPECT_EQ(int(store->steps("s1").size()), acked);
}

TEST_P(StoreSuite, ExpiryAndCountsSeeEverySession) {
    Batch b;
    for (int i = 0; i < 12; ++i) {
        SessionRecord r = session("s" + std::to_string(i), i % 2 ? "completed" : "waiting_user");
        r.updated_ms = 60000 * (i % 3);
        b.sessions.push_back(r);
    }
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    EXPECT_EQ(store->expired({"completed"}, 60000, 100).size(), 2u);  // odd i with i % 3 == 0: 3, 9
    EXPECT_EQ(store->expired({"completed", "waiting_user"}, 1000000, 5).size(), 5u);
    int64_t n = 0;
    for (const auto & c : store->count_since({"completed"}, 0))
        n += c.count;
    EXPECT_EQ(n, 6);
    EXPECT_EQ(store->sessions_not_in({"completed"}).size(), 6u);
}

TEST_P(StoreSuite, EndedSessionsAreCountedByCellStateDeadlineAndMove) {
    auto rec = [](const std::string & id, const std::string & cell, const std::string & state,
                  const std::string & reason = "", int64_t updated = 5000) {
        SessionRecord r = session(id, state);
        r.cell = cell;
        r.reason = reason;
        r.updated_ms = updated;
        return r;
    };
    Batch b;
    b.sessions = {rec("a1", "cell0", "completed"),
                  rec("a2", "cell0", "failed", "deadline (60 s) passed"),
                  rec("a3", "cell0", "failed", "the model failed: x"),
                  rec("a4", "cell0", "failed", "the model failed: y"),
                  rec("a5", "cell1", "cancelled"),
                  rec("a6", "cell1", "running"),
                  rec("a7", "cell0", "completed", "", 10)};  // before the window
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    for (int64_t epoch : {1, 2}) {  // a3 moved once; a4 was only placed
        Batch a;
        a.assign.push_back({"a3", "n" + std::to_string(epoch), epoch});
        if (epoch == 1) a.assign.push_back({"a4", "n1", 1});
        ASSERT_TRUE(store->commit_sync(std::move(a)).ok);
    }
    auto count = [](const std::vector<Store::EndedCount> & rows, const std::string & cell, const std::string & state,
                    bool deadline, bool moved) {
        int64_t n = 0;
        for (const auto & r : rows)
            if (r.cell == cell && r.state == state && r.deadline == deadline && r.moved == moved) n += r.count;
        return n;
    };
    const auto all = store->ended_since("", 1000).value();
    EXPECT_EQ(count(all, "cell0", "completed", false, false), 1);
    EXPECT_EQ(count(all, "cell0", "failed", true, false), 1);
    EXPECT_EQ(count(all, "cell0", "failed", false, true), 1);
    EXPECT_EQ(count(all, "cell0", "failed", false, false), 1);
    EXPECT_EQ(count(all, "cell1", "cancelled", false, false), 1);
    int64_t total = 0;
    for (const auto & r : all)
        total += r.count;
    EXPECT_EQ(total, 5);  // not the running one, not the one before the window
    const auto one = store->ended_since("cell1", 1000).value();
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].state, "cancelled");
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreSuite, ::testing::Values("sqlite", "postgres", "memory"),
                         [](const auto & info) { return info.param; });

// ---- SQLite only ----

TEST(SqliteStore, AnOlderFilesStoredResponsesMoveToTheirOwnTable) {
    const std::string dir = g_root + "/sqlite-v2";
    fs::create_directories(dir);
    sqlite3 * db = nullptr;
    ASSERT_EQ(sqlite3_open((dir + "/armada.db").c_str(), &db), SQLITE_OK);
    // Schema 2 as released: responses were sessions rows under agent "@response".
    const char * v2 = R"sql(
CREATE TABLE sessions (id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, owner TEXT NOT NULL, state TEXT NOT NULL,
  reason TEXT NOT NULL, data TEXT NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);
CREATE TABLE steps (session_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
  idempotency TEXT NOT NULL, ts_ms INTEGER NOT NULL, PRIMARY KEY (session_id, seq));
CREATE TABLE agents (tenant TEXT NOT NULL, id TEXT NOT NULL, spec TEXT NOT NULL, tools TEXT NOT NULL,
  created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, PRIMARY KEY (tenant, id));
CREATE INDEX sessions_state_updated ON sessions(state, updated_ms);
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
INSERT INTO sessions VALUES ('resp_old', '@response', 'tenant-a', 'completed', '', '{"response":{"id":"resp_old"}}', 7000, 7000);
INSERT INTO sessions VALUES ('sess_old', 'helper', 'tenant-a', 'waiting_user', '', '{}', 8000, 8000);
PRAGMA user_version = 2;
)sql";
    ASSERT_EQ(sqlite3_exec(db, v2, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
    std::string err;
    auto store = SqliteStore::open(dir, err);
    ASSERT_TRUE(store) << err;
    auto r = store->response("resp_old");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->tenant, "tenant-a");
    EXPECT_EQ(r->data, "{\"response\":{\"id\":\"resp_old\"}}");
    EXPECT_EQ(r->created_ms, 7000);
    EXPECT_FALSE(store->session("resp_old"));
    auto s = store->session("sess_old");
    ASSERT_TRUE(s);
    EXPECT_EQ(s->epoch, 0);
    EXPECT_EQ(s->node, "");
}

// ---- PostgreSQL only ----

int64_t rows_in(const std::string & url, const std::string & table) {
    PGconn * c = PQconnectdb(url.c_str());
    PGresult * r = PQexec(c, ("SELECT count(*) FROM " + table).c_str());
    const int64_t n = PQresultStatus(r) == PGRES_TUPLES_OK ? std::atoll(PQgetvalue(r, 0, 0)) : -1;
    PQclear(r);
    PQfinish(c);
    return n;
}

TEST(PostgresStore, SessionsAreShardedByIdOverSeveralDatabases) {
    Fixture fx = fresh("postgres", 3);
    std::string err;
    auto store = fx.open(err);
    ASSERT_TRUE(store) << err;
    for (int i = 0; i < 30; ++i) {
        const std::string id = "sess_" + std::to_string(i);
        Batch b;
        b.sessions.push_back(session(id));
        b.steps.push_back(step(id, 1));
        ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    }
    Batch a;
    a.agents.push_back({"t", "helper", "{}", "[]", 1, 1});
    ASSERT_TRUE(store->commit_sync(std::move(a)).ok);
    int64_t total = 0;
    for (const auto & url : fx.urls) {
        const int64_t n = rows_in(url, "sessions");
        EXPECT_GT(n, 0) << url;               // 30 ids over 3 databases: each holds some
        EXPECT_EQ(rows_in(url, "steps"), n);  // a session's steps live beside it
        total += n;
    }
    EXPECT_EQ(total, 30);
    EXPECT_EQ(rows_in(fx.urls[0], "agents"), 1);
    EXPECT_EQ(store->sessions_not_in({}).size(), 30u);
    for (int i = 0; i < 30; ++i)
        EXPECT_EQ(store->steps("sess_" + std::to_string(i)).size(), 1u);
}

TEST(PostgresStore, OpenSessionsSaysWhenAShardCouldNotBeReadInsteadOfListingTheRest) {
    Fixture fx = fresh("postgres", 2);
    std::string err;
    auto store = fx.open(err);
    ASSERT_TRUE(store) << err;
    for (int i = 0; i < 10; ++i) {
        Batch b;
        SessionRecord r = session("s" + std::to_string(i));
        r.cell = "c1";
        b.sessions.push_back(r);
        ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    }
    const std::vector<std::string> ended = {"completed", "failed", "cancelled"};
    ASSERT_TRUE(store->open_sessions("c1", "", ended));
    EXPECT_EQ(store->open_sessions("c1", "", ended)->size(), 10u);
    // The second shard's table goes away: its read fails, and the answer is not the first's rows.
    ASSERT_GT(rows_in(fx.urls[1], "sessions"), 0);
    PGconn * c = PQconnectdb(fx.urls[1].c_str());
    PQclear(PQexec(c, "ALTER TABLE sessions RENAME TO sessions_gone"));
    PQfinish(c);
    EXPECT_FALSE(store->open_sessions("c1", "", ended).has_value());
}

TEST(PostgresStore, ANewLeadersMarkReachesEveryShardWithAProbe) {
    Fixture fx = fresh("postgres", 3);
    std::string err;
    auto store = fx.open(err);
    ASSERT_TRUE(store) << err;
    std::vector<std::string> ids;
    for (int i = 0; i < 12; ++i) {
        ids.push_back("sess_" + std::to_string(i));
        Batch b;
        b.sessions.push_back(session(ids.back()));
        ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    }
    // The new leader's first write: a probe under its leadership, to every shard.
    Batch first;
    first.probe = true;
    first.leader = {"cell0", 20};
    ASSERT_TRUE(store->commit_sync(std::move(first)).ok);
    // The old leader is refused on every shard, whichever session it places.
    for (const auto & id : ids) {
        const Status st = store->commit_sync(led(assign(id, "node-1", 1), "cell0", 10));
        EXPECT_TRUE(st.fenced) << id << ": " << st.error;
        EXPECT_EQ(store->session(id)->epoch, 0) << id;
    }
}

TEST(PostgresStore, ARepeatedCommitIsHarmlessButADifferentStepAtAnIndexIsRefused) {
    Fixture fx = fresh("postgres");
    std::string err;
    auto store = fx.open(err);
    ASSERT_TRUE(store) << err;
    Batch b;
    b.sessions.push_back(session("s1"));
    b.steps.push_back(step("s1", 1, "{\"a\":1}"));
    ASSERT_TRUE(store->commit_sync(b).ok);
    // The same batch again (its COMMIT's answer was lost, the writer retries): fine.
    ASSERT_TRUE(store->commit_sync(b).ok);
    Batch fork;
    fork.steps.push_back(step("s1", 1, "{\"a\":2}"));
    const Status st = store->commit_sync(std::move(fork));
    EXPECT_FALSE(st.ok);
    EXPECT_NE(st.error.find("already holds a different entry"), std::string::npos) << st.error;
    EXPECT_EQ(store->steps("s1").at(0).payload, "{\"a\":1}");
}

TEST(PostgresStore, TenantsAndTheirKeysAreKeptWithClearResults) {
    Fixture fx = fresh("postgres");
    PostgresConfig c;
    c.urls = fx.urls;
    std::string err;
    auto store = PostgresStore::open(c, err);
    ASSERT_TRUE(store) << err;
    TenantRecord acme{"acme", 60, 1000, 5, 1 << 20, 1, 1};
    EXPECT_EQ(store->create_tenant(acme), AdminResult::ok);
    EXPECT_EQ(store->create_tenant(acme), AdminResult::exists);
    acme.live_sessions = 9;
    EXPECT_EQ(store->update_tenant(acme), AdminResult::ok);
    EXPECT_EQ(store->update_tenant(TenantRecord{"nobody"}), AdminResult::missing);
    EXPECT_EQ(store->create_key({"key_1", "hash1", "acme", "sk-armada-ab", false, 2}), AdminResult::ok);
    EXPECT_EQ(store->create_key({"key_2", "hash2", "nobody", "sk-armada-cd", false, 2}), AdminResult::missing);
    EXPECT_EQ(store->create_key({"key_3", "hash1", "acme", "sk-armada-ef", true, 2}), AdminResult::exists);
    auto tenants = store->tenants();
    ASSERT_TRUE(tenants);
    ASSERT_EQ(tenants->size(), 1u);
    EXPECT_EQ(tenants->at(0).live_sessions, 9);
    EXPECT_EQ(tenants->at(0).rpm, 60);
    auto keys = store->keys();
    ASSERT_TRUE(keys);
    ASSERT_EQ(keys->size(), 1u);
    EXPECT_EQ(keys->at(0).hash, "hash1");
    // A tenant's open sessions, for its live-sessions quota.
    Batch b;
    for (const char * id : {"o1", "o2", "o3"}) {
        auto s = session(id);
        s.owner = "t:acme";
        b.sessions.push_back(s);
    }
    b.sessions[1].state = "completed";
    b.sessions.push_back(session("theirs"));
    ASSERT_TRUE(store->commit_sync(b).ok);
    auto open = store->open_ids_of("t:acme", {"completed", "failed", "cancelled"});
    ASSERT_TRUE(open);
    std::sort(open->begin(), open->end());
    EXPECT_EQ(*open, (std::vector<std::string>{"o1", "o3"}));
    // A tenant's keys go with it.
    EXPECT_EQ(store->delete_tenant("acme"), AdminResult::ok);
    EXPECT_EQ(store->delete_tenant("acme"), AdminResult::missing);
    EXPECT_TRUE(store->keys()->empty());
    EXPECT_EQ(store->delete_key("key_1"), AdminResult::missing);
}

TEST(PostgresStore, MigrationsAreVersionedAndAppliedOnce) {
    Fixture fx = fresh("postgres");
    std::string err;
    // Two stores opening the same new database at once, as nodes starting together do.
    auto f1 = std::async(std::launch::async, [&] {
        std::string e;
        return fx.open(e) != nullptr;
    });
    auto f2 = std::async(std::launch::async, [&] {
        std::string e;
        return fx.open(e) != nullptr;
    });
    EXPECT_TRUE(f1.get());
    EXPECT_TRUE(f2.get());
    PGconn * c = PQconnectdb(fx.urls[0].c_str());
    PGresult * r = PQexec(c, "SELECT version FROM armada_schema");
    ASSERT_EQ(PQntuples(r), 1);
    EXPECT_EQ(std::atoi(PQgetvalue(r, 0, 0)), PostgresStore::schema_version());
    PQclear(r);
    // A database from a newer build is refused with a clear reason.
    PQclear(PQexec(c, "UPDATE armada_schema SET version = 999"));
    PQfinish(c);
    auto s = fx.open(err);
    EXPECT_FALSE(s);
    EXPECT_NE(err.find("newer Armada"), std::string::npos) << err;
}

TEST(PostgresStore, AServerRestartFailsWritesUntilItIsBackThenNothingIsLost) {
    Fixture fx = fresh("postgres");
    std::string err;
    auto store = fx.open(err);
    ASSERT_TRUE(store) << err;
    Batch b;
    b.sessions.push_back(session("s1"));
    b.steps.push_back(step("s1", 1));
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    ASSERT_EQ(g_pg->stop(), "");
    const Status down = store->commit_sync(fenced_step("s1", 2, "", 0));
    EXPECT_FALSE(down.ok);  // not acknowledged while the server is away
    EXPECT_FALSE(down.fenced);
    EXPECT_FALSE(store->writable().ok);
    EXPECT_FALSE(store->recover().ok);
    // A read says nothing of the row then: not "missing" (a node would stop a live session).
    EXPECT_FALSE(store->session("s1"));
    EXPECT_FALSE(store->has_session("s1").has_value());
    ASSERT_EQ(g_pg->restart(), "");
    ASSERT_TRUE(store->recover().ok);
    EXPECT_TRUE(store->writable().ok);
    ASSERT_TRUE(store->commit_sync(fenced_step("s1", 2, "", 0)).ok);
    const auto steps = store->steps("s1");  // the read pool reconnects too
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_EQ(store->has_session("s1"), std::optional<bool>(true));
    EXPECT_EQ(store->has_session("nope"), std::optional<bool>(false));
    EXPECT_GE(store->pool_stats()->reconnects, 1u);
}

// A pool of one read connection, held by a read that waits on a table lock: the next read waits
// for the pool (counted, timed), and one that waits past the pool's limit gives up (counted).
TEST(PostgresStore, ReadsThatFindNoFreeConnectionWaitAndTheWaitsAreCounted) {
    Fixture fx = fresh("postgres");
    PostgresConfig c;
    c.urls = fx.urls;
    c.read_connections = 1;
    c.pool_wait_ms = 1500;
    std::string err;
    auto store = PostgresStore::open(c, err);
    ASSERT_TRUE(store) << err;
    Batch b;
    b.sessions.push_back(session("s1"));
    ASSERT_TRUE(store->commit_sync(std::move(b)).ok);
    ASSERT_EQ(store->pool_stats()->size, 1u);
    ASSERT_EQ(store->pool_stats()->waited, 0u);

    PGconn * locker = PQconnectdb(fx.urls[0].c_str());
    ASSERT_EQ(PQstatus(locker), CONNECTION_OK);
    auto exec = [&](const char * sql) { PQclear(PQexec(locker, sql)); };
    exec("BEGIN");
    exec("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE");
    auto poll = [&](auto pred) {
        for (int i = 0; i < 2000 && !pred(*store->pool_stats()); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return pred(*store->pool_stats());
    };
    // The first read takes the only connection and blocks on the lock.
    auto first = std::async(std::launch::async, [&] { return store->session("s1"); });
    ASSERT_TRUE(poll([](const PoolStats & p) { return p.in_use == 1; }));
    // The second finds none free and gives up after 1.5 s: a timeout, and no answer.
    auto gave_up = std::async(std::launch::async, [&] { return store->session("s1"); });
    EXPECT_FALSE(gave_up.get());
    EXPECT_EQ(store->pool_stats()->timeouts, 1u);
    // A third waits while the lock holds, and is served once it goes.
    auto third = std::async(std::launch::async, [&] { return store->session("s1"); });
    ASSERT_TRUE(poll([](const PoolStats & p) { return p.waited == 2; }));
    exec("COMMIT");
    EXPECT_TRUE(first.get());
    EXPECT_TRUE(third.get());
    PQfinish(locker);
    const PoolStats p = *store->pool_stats();
    EXPECT_EQ(p.waited, 2u);
    EXPECT_EQ(p.timeouts, 1u);
    EXPECT_GE(p.wait_us, 1500000u);  // the one that gave up waited its whole limit
    EXPECT_EQ(p.in_use, 0u);
}

TEST(PostgresStore, OpeningAnUnreachableServerSaysWhereWithoutThePassword) {
    PostgresConfig c;
    c.urls = {"postgres://armada:s3cret@127.0.0.1:" + std::to_string(cluster::free_port()) + "/x"};
    c.connect_timeout_s = 2;
    std::string err;
    EXPECT_FALSE(PostgresStore::open(c, err));
    EXPECT_NE(err.find("cannot connect to PostgreSQL postgres://armada:***@127.0.0.1"), std::string::npos) << err;
    EXPECT_EQ(err.find("s3cret"), std::string::npos) << err;
}

}  // namespace

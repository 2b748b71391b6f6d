// PostgreSQL that hangs (accepts, never answers) behind a proxy: every store call still returns,
// with an error, within its bound; and the store works again once the server answers.
#include "cluster/local_servers.h"
#include "cluster/runtime/elected.h"
#include "hang_proxy.h"
#include "servers.h"
#include "store/postgres_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>

using namespace armada;

namespace {
int64_t ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST(StoreHang, APostgresThatStopsAnsweringFailsEachCallWithinItsBoundAndTheStoreRecovers) {
    cluster::LocalPostgres pg;
    ASSERT_EQ(pg.start(servers().root + "/pg-hang"), "");
    ASSERT_EQ(pg.create_database("hang"), "");
    HangProxy proxy(pg.port());
    ASSERT_GT(proxy.port(), 0);
    std::string url = pg.url("hang");
    const std::string port = ":" + std::to_string(pg.port()) + "/";
    url.replace(url.find(port), port.size(), ":" + std::to_string(proxy.port()) + "/");
    // The passfile names the server's own port: the password goes in the URL instead.
    std::ifstream pw_file(pg.secrets_dir() + "/postgres");
    std::string password;
    std::getline(pw_file, password);
    url += "&password=" + password;

    store::PostgresConfig pc;
    pc.urls = {url};
    pc.read_connections = 1;
    pc.statement_timeout_ms = 1000;  // so the client gives up 2 s later
    std::string err;
    auto st = store::PostgresStore::open(pc, err);
    ASSERT_TRUE(st) << err;
    const std::vector<std::string> ended = {"completed", "failed", "cancelled"};
    ASSERT_TRUE(st->open_sessions("c", "", ended));
    // A brain's store, with the limits its lease TTL (3 s) sets.
    store::PostgresConfig bc = pc;
    cluster::brain_store_limits(3, bc.statement_timeout_ms, bc.client_grace_ms);
    auto brain = store::PostgresStore::open(bc, err);
    ASSERT_TRUE(brain) << err;
    ASSERT_TRUE(brain->open_sessions("c", "", ended));

    proxy.hang();
    // The brain's read fails inside the brain's stall limit, so a leader whose PostgreSQL hangs
    // goes on beating (and leading) rather than giving the lead to a standby that would hang too.
    {
        const auto b0 = std::chrono::steady_clock::now();
        auto r = std::async(std::launch::async, [&] { return brain->open_sessions("c", "", ended); });
        ASSERT_EQ(r.wait_for(std::chrono::seconds(15)), std::future_status::ready);
        EXPECT_FALSE(r.get());
        EXPECT_LT(ms_since(b0), cluster::stall_limit_ms(3)) << "a brain's read outlasted its stall limit";
    }
    // A read, and a write through the writer thread: each must come back, with an error, in
    // about 3 s. A call still blocked after 15 s fails the test (the proxy then resumes, so it
    // ends).
    const auto t0 = std::chrono::steady_clock::now();
    auto read = std::async(std::launch::async, [&] { return st->open_sessions("c", "", ended); });
    std::promise<store::Status> wrote;
    store::Batch b;
    b.probe = true;
    st->commit(std::move(b), [&](store::Status s) { wrote.set_value(std::move(s)); });
    auto write = wrote.get_future();
    const bool read_back = read.wait_for(std::chrono::seconds(15)) == std::future_status::ready;
    const bool write_back = write.wait_for(std::chrono::seconds(15)) == std::future_status::ready;
    const int64_t took = ms_since(t0);
    proxy.resume();
    ASSERT_TRUE(read_back) << "a read blocked on a server that never answers";
    ASSERT_TRUE(write_back) << "a commit blocked on a server that never answers";
    EXPECT_FALSE(read.get()) << "a read with no answer is an error, not an empty list";
    const store::Status ws = write.get();
    EXPECT_FALSE(ws.ok);
    EXPECT_NE(ws.error.find("did not answer within"), std::string::npos) << ws.error;
    EXPECT_LT(took, 8000);

    // The server answers again: the next calls reconnect and succeed.
    EXPECT_TRUE(st->open_sessions("c", "", ended));
    EXPECT_TRUE(st->recover().ok);
    std::promise<store::Status> again;
    store::Batch b2;
    b2.probe = true;
    st->commit(std::move(b2), [&](store::Status s) { again.set_value(std::move(s)); });
    const store::Status s2 = again.get_future().get();
    EXPECT_TRUE(s2.ok) << s2.error;
}

TEST(StoreLeaders, AfterEtcdsRevisionsWentBackwardsForgetLeadersLetsANewLeaderWrite) {
    // A brain led at etcd revision 1000; etcd is then restored to an earlier snapshot, and the
    // next leader's revision is 5: the store refuses it (a mark above its own) until the
    // operator runs `armada cluster forget-leaders`.
    cluster::LocalPostgres pg;
    ASSERT_EQ(pg.start(servers().root + "/pg-leaders"), "");
    ASSERT_EQ(pg.create_database("leaders"), "");
    store::PostgresConfig pc;
    pc.urls = {pg.url("leaders")};
    pc.read_connections = 1;
    std::string err;
    auto st = store::PostgresStore::open(pc, err);
    ASSERT_TRUE(st) << err;
    const auto lead = [&](int64_t rev) {
        store::Batch b;
        b.probe = true;
        b.leader = {"/armada/cells/c1/brain", rev};
        return st->commit_sync(std::move(b));
    };
    ASSERT_TRUE(lead(1000).ok);
    const store::Status refused = lead(5);
    EXPECT_TRUE(refused.deposed);
    EXPECT_NE(refused.error.find("armada cluster forget-leaders"), std::string::npos) << refused.error;

    const std::string dir = servers().root + "/leaders-cfg";
    std::filesystem::create_directories(dir);
    ASSERT_EQ(cluster::write_private(dir + "/cluster.yaml",
                                     "etcd: [127.0.0.1:2379]\npostgres: [\"" + pg.url("leaders") + "\"]\n"),
              "");
    const char * bin = std::getenv("ARMADA_BIN");
    ASSERT_TRUE(bin) << "ARMADA_BIN names the armada binary";
    const int rc = cluster::run_command({bin, "cluster", "forget-leaders", "--cluster", dir + "/cluster.yaml"},
                                        dir + "/forget.log", "", err);
    ASSERT_EQ(rc, 0) << err << cluster::tail_of(dir + "/forget.log");
    EXPECT_NE(cluster::tail_of(dir + "/forget.log").find("leader marks are gone from 1"), std::string::npos);
    EXPECT_TRUE(lead(5).ok) << "the new leader writes once the old marks are gone";
    EXPECT_TRUE(lead(4).deposed) << "and its own mark fences the ones before it again";
}

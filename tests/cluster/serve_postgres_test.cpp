// `armada serve --state postgres://…`: a real node checkpoints into a real PostgreSQL, is killed,
// and finds its session there after the restart.
#include "cluster/local_servers.h"
#include "servers.h"
#include "tools/http_sync.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace armada;
using json = nlohmann::json;

namespace {

tools::HttpReply http(const std::string & method, const std::string & url, const std::string & body = {}) {
    tools::SsrfGuard guard;
    tools::Cidr loopback;
    tools::parse_cidr("127.0.0.0/8", loopback);
    guard.allow(loopback);
    tools::HttpOptions opt;
    opt.timeout_ms = 10000;
    return tools::http_request(method, url, {{"Content-Type", "application/json"}}, body, opt, guard);
}

int64_t count_rows(const std::string & url, const std::string & sql) {
    PGconn * c = PQconnectdb(url.c_str());
    PGresult * r = PQexec(c, sql.c_str());
    const int64_t n = PQresultStatus(r) == PGRES_TUPLES_OK ? std::atoll(PQgetvalue(r, 0, 0)) : -1;
    PQclear(r);
    PQfinish(c);
    return n;
}

}  // namespace

TEST(ServeOnPostgres, ASessionIsCheckpointedInPostgresAndSurvivesAKill) {
    const char * bin = std::getenv("ARMADA_BIN");
    const char * models = std::getenv("ARMADA_MODEL_DIR");
    ASSERT_TRUE(bin && models) << "ctest sets ARMADA_BIN and ARMADA_MODEL_DIR";
    const std::string root = servers().root + "/serve-pg";
    cluster::LocalPostgres pg;
    ASSERT_EQ(pg.start(root + "/pg"), "");
    ASSERT_EQ(pg.create_database("node"), "");
    const std::string state = pg.url("node");
    const std::string agents = root + "/agents.yaml";
    std::ofstream(agents) << "agents:\n  - id: plain\n    instructions: Say hello.\n"
                             "    limits: { max_steps: 2, max_tokens_per_step: 16 }\n";
    const int port = cluster::free_port();
    const std::string base = "http://127.0.0.1:" + std::to_string(port);
    auto start = [&]() -> std::optional<cluster::Child> {
        std::string err;
        auto c = cluster::Child::spawn(
            {bin, "serve", "-m", std::string(models) + "/armada-tiny-q8_0.gguf", "--port", std::to_string(port),
             "--state", state, "--data-dir", root + "/data", "--agents", agents, "-c", "2048", "-np", "2", "-t", "2"},
            root + "/serve.log", "", err);
        EXPECT_TRUE(c) << err;
        for (int i = 0; c && i < 1200; ++i) {
            if (http("GET", base + "/readyz").status == 200) return c;
            if (!c->running()) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        ADD_FAILURE() << "armada did not become ready: " << cluster::tail_of(root + "/serve.log");
        return std::nullopt;
    };
    auto node = start();
    ASSERT_TRUE(node);
    const auto created = http("POST", base + "/v1/agents/plain/sessions", R"({"input":"hi"})");
    ASSERT_EQ(created.status, 200) << created.body;
    const std::string id = json::parse(created.body)["id"];
    json s;
    for (int i = 0; i < 600; ++i) {
        s = json::parse(http("GET", base + "/v1/sessions/" + id).body);
        if (s["state"] == "completed" || s["state"] == "failed") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(s["state"], "completed") << s.dump();
    const size_t steps = s["steps"].size();
    EXPECT_GE(steps, 2u);
    // The checkpoint is in PostgreSQL, not in SQLite under --data-dir.
    EXPECT_EQ(count_rows(state, "SELECT count(*) FROM sessions WHERE id = '" + id + "'"), 1);
    EXPECT_GE(count_rows(state, "SELECT count(*) FROM steps WHERE session_id = '" + id + "'"), int64_t(steps));
    // The read pool shows in /metrics.
    const auto metrics = http("GET", base + "/metrics").body;
    EXPECT_NE(metrics.find("armada_store_pool_connections 8"), std::string::npos);

    node->stop(SIGKILL, 5000);
    node = start();
    ASSERT_TRUE(node);
    const auto again = json::parse(http("GET", base + "/v1/sessions/" + id).body);
    EXPECT_EQ(again["state"], "completed") << again.dump();
    EXPECT_EQ(again["steps"].size(), steps);
    EXPECT_EQ(node->stop(SIGTERM, 30000), 0);
}

// `--state URL1,URL2`: sessions are spread by id over both databases, each with its own steps.
TEST(ServeOnPostgres, TwoStateUrlsShardSessionsOverBothDatabases) {
    const char * bin = std::getenv("ARMADA_BIN");
    const char * models = std::getenv("ARMADA_MODEL_DIR");
    ASSERT_TRUE(bin && models) << "ctest sets ARMADA_BIN and ARMADA_MODEL_DIR";
    const std::string root = servers().root + "/serve-shards";
    cluster::LocalPostgres pg;
    ASSERT_EQ(pg.start(root + "/pg"), "");
    ASSERT_EQ(pg.create_database("shard0"), "");
    ASSERT_EQ(pg.create_database("shard1"), "");
    const std::vector<std::string> dbs = {pg.url("shard0"), pg.url("shard1")};
    const std::string agents = root + "/agents.yaml";
    std::ofstream(agents) << "agents:\n  - id: plain\n    instructions: Say hello.\n"
                             "    limits: { max_steps: 1, max_tokens_per_step: 4 }\n";
    const int port = cluster::free_port();
    const std::string base = "http://127.0.0.1:" + std::to_string(port);
    std::string err;
    auto node = cluster::Child::spawn(
        {bin, "serve", "-m", std::string(models) + "/armada-tiny-q8_0.gguf", "--port", std::to_string(port), "--state",
         dbs[0] + "," + dbs[1], "--data-dir", root + "/data", "--agents", agents, "-c", "2048", "-np", "2", "-t", "2"},
        root + "/serve.log", "", err);
    ASSERT_TRUE(node) << err;
    bool ready = false;
    for (int i = 0; i < 1200 && !ready && node->running(); ++i) {
        ready = http("GET", base + "/readyz").status == 200;
        if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(ready) << cluster::tail_of(root + "/serve.log");
    // 16 sessions: all on one shard by chance would be 1 in 2^15.
    std::vector<std::string> ids;
    for (int i = 0; i < 16; ++i) {
        const auto created = http("POST", base + "/v1/agents/plain/sessions", R"({"input":"hi"})");
        ASSERT_EQ(created.status, 200) << created.body;
        ids.push_back(json::parse(created.body)["id"]);
    }
    int64_t total = 0;
    for (const auto & db : dbs) {
        const int64_t n = count_rows(db, "SELECT count(*) FROM sessions");
        EXPECT_GT(n, 0) << db;
        total += n;
        // Each session's steps are in its own database (the input is step 1, committed with the row).
        EXPECT_EQ(count_rows(db, "SELECT count(*) FROM steps WHERE session_id NOT IN (SELECT id FROM sessions)"), 0)
            << db;
        EXPECT_GE(count_rows(db, "SELECT count(DISTINCT session_id) FROM steps"), n) << db;
    }
    EXPECT_EQ(total, 16);
    // Every session reads back through the node, whichever database holds it.
    for (const auto & id : ids)
        EXPECT_EQ(http("GET", base + "/v1/sessions/" + id).status, 200) << id;
    EXPECT_EQ(node->stop(SIGTERM, 30000), 0);
}

TEST(ServeOnPostgres, AnUnreachableDatabaseStopsTheStartWithItsAddressNotItsPassword) {
    const char * bin = std::getenv("ARMADA_BIN");
    const char * models = std::getenv("ARMADA_MODEL_DIR");
    ASSERT_TRUE(bin && models) << "ctest sets ARMADA_BIN and ARMADA_MODEL_DIR";
    const std::string root = servers().root + "/serve-nopg";
    std::filesystem::create_directories(root);
    const std::string url = "postgres://armada:s3cret@127.0.0.1:" + std::to_string(cluster::free_port()) + "/x";
    std::string err;
    auto c = cluster::Child::spawn(
        {bin, "serve", "-m", std::string(models) + "/armada-tiny-q8_0.gguf", "--port", "0", "--state", url},
        root + "/serve.log", "", err);
    ASSERT_TRUE(c) << err;
    EXPECT_EQ(c->wait(30000), 1);
    const std::string log = cluster::tail_of(root + "/serve.log");
    EXPECT_NE(log.find("cannot connect to PostgreSQL postgres://armada:***@127.0.0.1"), std::string::npos) << log;
    EXPECT_EQ(log.find("s3cret"), std::string::npos) << log;
}

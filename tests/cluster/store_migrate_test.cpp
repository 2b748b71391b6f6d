// Schema migrations on a real PostgreSQL: the indexes on `sessions` are built concurrently, so
// a store already holding rows takes writes while a new node upgrades it; a build that failed
// part-way is built again; nodes that start together each find the schema done.
#include "cluster/local_servers.h"
#include "servers.h"
#include "store/postgres_store.h"

#include <gtest/gtest.h>

#include <libpq-fe.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

using namespace armada;

namespace {

//! One connection of the test's own, as the superuser.
class Conn {
  public:
    explicit Conn(const std::string & conninfo) : c_(PQconnectdb(conninfo.c_str())) {}
    ~Conn() { PQfinish(c_); }
    Conn(const Conn &) = delete;
    Conn & operator=(const Conn &) = delete;
    bool ok() const { return PQstatus(c_) == CONNECTION_OK; }
    //! Runs `sql`; the first value of the first row ("" when none), or the error in `err`.
    std::string run(const std::string & sql, std::string & err) {
        PGresult * r = PQexec(c_, sql.c_str());
        std::string out;
        const auto st = PQresultStatus(r);
        if (st == PGRES_TUPLES_OK && PQntuples(r) > 0)
            out = PQgetvalue(r, 0, 0);
        else if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
            err = PQerrorMessage(c_);
        PQclear(r);
        return out;
    }

  private:
    PGconn * c_;
};

std::unique_ptr<store::PostgresStore> open_store(const std::string & url, std::string & err) {
    store::PostgresConfig pc;
    pc.urls = {url};
    pc.read_connections = 1;
    return store::PostgresStore::open(pc, err);
}

std::string index_state(Conn & c, const std::string & index) {
    std::string err;
    const std::string v = c.run(
        "SELECT CASE WHEN i.indisvalid THEN 'valid' ELSE 'invalid' END FROM pg_index i "
        "WHERE i.indexrelid = to_regclass('" +
            index + "')",
        err);
    return err.empty() ? (v.empty() ? "missing" : v) : "error: " + err;
}

const char * kRow =
    "INSERT INTO sessions(id,agent_id,owner,state,reason,data,created_ms,updated_ms,node,epoch,cell) "
    "VALUES ('%s','a','t','running','','{}',1,1,'n1',1,'c1')";

std::string insert_row(const std::string & id) {
    char sql[512];
    std::snprintf(sql, sizeof sql, kRow, id.c_str());
    return sql;
}

}  // namespace

TEST(StoreMigrations, IndexesAreBuiltConcurrentlyAgainAfterAFailedBuildAndOnceByNodesStartingTogether) {
    cluster::LocalPostgres pg;
    ASSERT_EQ(pg.start(servers().root + "/pg-migrate"), "");
    std::string err;

    // 1. A store at schema 3 (before the open-rows and ended-rows indexes), with a writer that
    // holds a transaction open on `sessions`. Upgrading it must not hold up other writers: a
    // plain CREATE INDEX would wait for that transaction and every insert would queue behind it.
    ASSERT_EQ(pg.create_database("upgrade"), "");
    {
        auto st = open_store(pg.url("upgrade"), err);
        ASSERT_TRUE(st) << err;
    }
    Conn admin(pg.superuser_conninfo("upgrade"));
    ASSERT_TRUE(admin.ok());
    admin.run("DROP INDEX sessions_open; DROP INDEX sessions_ended; UPDATE armada_schema SET version = 3", err);
    ASSERT_TRUE(err.empty()) << err;
    Conn holder(pg.superuser_conninfo("upgrade"));
    holder.run("BEGIN; " + insert_row("held"), err);
    ASSERT_TRUE(err.empty()) << err;
    auto upgrade = std::async(std::launch::async, [&] {
        std::string e;
        auto st = open_store(pg.url("upgrade"), e);
        return st ? std::string() : e;
    });
    // Wait until the upgrade's index build is under way (waiting for the held transaction).
    bool building = false;
    for (int i = 0; i < 300 && !building; ++i) {
        building = admin.run(
                       "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%CREATE INDEX%' "
                       "AND state = 'active' AND pid <> pg_backend_pid()",
                       err) == "1";
        if (!building) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(building) << "the upgrade never began building an index: " << err;
    {
        Conn writer(pg.superuser_conninfo("upgrade"));
        writer.run("SET statement_timeout = 3000", err);
        writer.run(insert_row("during"), err);
        EXPECT_TRUE(err.empty()) << "a write while the index builds: " << err;
        err.clear();
    }
    EXPECT_NE(upgrade.wait_for(std::chrono::milliseconds(0)), std::future_status::ready)
        << "the build did not wait for the open transaction";
    holder.run("COMMIT", err);
    ASSERT_TRUE(err.empty()) << err;
    ASSERT_EQ(upgrade.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    ASSERT_EQ(upgrade.get(), "");
    EXPECT_EQ(admin.run("SELECT version FROM armada_schema", err), "5");
    EXPECT_EQ(index_state(admin, "sessions_open"), "valid");
    EXPECT_EQ(index_state(admin, "sessions_ended"), "valid");

    // 2. A build that failed part-way leaves its index INVALID (PostgreSQL keeps it, unused):
    // the next open drops it and builds it again rather than count it done.
    admin.run(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass('sessions_open'); "
        "UPDATE armada_schema SET version = 3",
        err);
    ASSERT_TRUE(err.empty()) << err;
    ASSERT_EQ(index_state(admin, "sessions_open"), "invalid");
    {
        auto st = open_store(pg.url("upgrade"), err);
        ASSERT_TRUE(st) << err;
    }
    EXPECT_EQ(index_state(admin, "sessions_open"), "valid");
    EXPECT_EQ(admin.run("SELECT version FROM armada_schema", err), "5");

    // 3. Four nodes opening a fresh database at once: each opens, the schema is made once.
    ASSERT_EQ(pg.create_database("together"), "");
    std::vector<std::future<std::string>> opens;
    for (int i = 0; i < 4; ++i)
        opens.push_back(std::async(std::launch::async, [&] {
            std::string e;
            auto st = open_store(pg.url("together"), e);
            return st ? std::string() : e;
        }));
    for (auto & f : opens) {
        ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
        EXPECT_EQ(f.get(), "");
    }
    Conn together(pg.superuser_conninfo("together"));
    EXPECT_EQ(together.run("SELECT version FROM armada_schema", err), "5");
    EXPECT_EQ(together.run("SELECT count(*) FROM armada_schema", err), "1");
    EXPECT_EQ(index_state(together, "sessions_open"), "valid");
}

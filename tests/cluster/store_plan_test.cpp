// The queries the brains and nodes run every few seconds read open rows only, through the
// `sessions_open` index, however many ended sessions the retention keeps, and the survival figure
// reads one cell's window of ended rows through `sessions_ended` (PostgreSQL's own plan, on a
// table of 200,000 ended and 2,000 open sessions).
#include "cluster/local_servers.h"
#include "servers.h"
#include "store/postgres_store.h"

#include <gtest/gtest.h>

#include <libpq-fe.h>
#include <algorithm>

#include <cstdio>
#include <cstdlib>

using namespace armada;

namespace {

//! EXPLAIN (ANALYZE, FORMAT JSON) of `sql` with `params`, as text ("" on error, with it in `err`).
std::string plan_of(const std::string & conninfo, const std::string & sql, const std::vector<std::string> & params,
                    std::string & err) {
    PGconn * c = PQconnectdb(conninfo.c_str());
    std::vector<const char *> v;
    for (const auto & p : params)
        v.push_back(p.c_str());
    const std::string explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + sql;
    PGresult * r = PQexecParams(c, explain.c_str(), int(v.size()), nullptr, v.data(), nullptr, nullptr, 0);
    std::string out;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0)
        out = PQgetvalue(r, 0, 0);
    else
        err = PQerrorMessage(c);
    PQclear(r);
    PQfinish(c);
    return out;
}

bool exec(const std::string & conninfo, const std::string & sql, std::string & err) {
    PGconn * c = PQconnectdb(conninfo.c_str());
    PGresult * r = PQexec(c, sql.c_str());
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok) err = PQerrorMessage(c);
    PQclear(r);
    PQfinish(c);
    return ok;
}

}  // namespace

namespace {
//! A count from the environment (the benchmark's sizes), else `fallback`.
long env_count(const char * name, long fallback) {
    const char * v = std::getenv(name);
    return v && *v ? std::atol(v) : fallback;
}

//! PostgreSQL's "Execution Time" from an EXPLAIN (ANALYZE, FORMAT JSON), in ms (-1: none).
double execution_ms(const std::string & plan) {
    const auto at = plan.find("\"Execution Time\": ");
    return at == std::string::npos ? -1 : std::atof(plan.c_str() + at + 18);
}
}  // namespace

// Sizes: ARMADA_PLAN_ENDED (200,000) ended and ARMADA_PLAN_OPEN (2,000) open sessions over 4
// cells; docs/SCALE.md runs it with 5,000,000 and 80,000 (20,000 open in the cell read).
TEST(StorePlan, ACellsOpenSessionsAreReadThroughTheOpenRowsIndexNotTheEndedOnes) {
    const long n_ended = env_count("ARMADA_PLAN_ENDED", 200000), n_open = env_count("ARMADA_PLAN_OPEN", 2000);
    cluster::LocalPostgres pg;
    ASSERT_EQ(pg.start(servers().root + "/pg-plan"), "");
    ASSERT_EQ(pg.create_database("plan"), "");
    std::string err;
    {
        store::PostgresConfig pc;
        pc.urls = {pg.url("plan")};
        pc.read_connections = 1;
        auto st = store::PostgresStore::open(pc, err);  // the schema, migrations included
        ASSERT_TRUE(st) << err;
    }
    const std::string db = pg.superuser_conninfo("plan");
    // Ended sessions over 4 cells, and open ones spread over 20 nodes.
    ASSERT_TRUE(exec(db,
                     "INSERT INTO sessions(id,agent_id,owner,state,reason,data,created_ms,updated_ms,node,epoch,cell) "
                     "SELECT 'e' || i, 'a', 't', (ARRAY['completed','failed','cancelled'])[1 + i % 3], '', '{}', i, i, "
                     "'n' || (i % 20), 1, 'c' || (i % 4) FROM generate_series(1, " +
                         std::to_string(n_ended) + ") i",
                     err))
        << err;
    ASSERT_TRUE(exec(db,
                     "INSERT INTO sessions(id,agent_id,owner,state,reason,data,created_ms,updated_ms,node,epoch,cell) "
                     "SELECT 'o' || i, 'a', 't', (ARRAY['queued','running','waiting_tool'])[1 + i % 3], '', '{}', i, "
                     "i, 'n' || (i % 20), 1, 'c' || (i % 4) FROM generate_series(1, " +
                         std::to_string(n_open) + ") i",
                     err))
        << err;
    ASSERT_TRUE(exec(db, "ANALYZE sessions", err)) << err;
    const std::vector<std::string> ended = {"completed", "failed", "cancelled"};
    for (const bool by_node : {false, true}) {
        size_t used = 0;
        const std::string sql = store::PostgresStore::open_sessions_sql(ended, by_node, used);
        std::vector<std::string> params = {"c1"};
        if (by_node) params.push_back("n1");
        ASSERT_EQ(used, params.size()) << sql;
        const std::string plan = plan_of(db, sql, params, err);
        ASSERT_FALSE(plan.empty()) << err;
        EXPECT_NE(plan.find("\"Index Name\": \"sessions_open\""), std::string::npos)
            << (by_node ? "the node's pass" : "the cell's reconcile") << " does not use the open rows' index:\n"
            << plan;
        EXPECT_EQ(plan.find("Seq Scan"), std::string::npos) << plan;
        EXPECT_EQ(plan.find("Rows Removed by Filter"), std::string::npos) << "it reads rows it throws away:\n" << plan;
        printf("%s over %ld ended and %ld open sessions: %.2f ms\n", by_node ? "node pass" : "cell reconcile", n_ended,
               n_open, execution_ms(plan));
    }
    // The survival figure: one cell's ended rows of the last `window` (the newest 2% of the ended
    // rows, over all 4 cells), through the ended rows' index, not every cell's window.
    const long window = std::max(1L, n_ended / 50);
    const std::string sql = store::PostgresStore::ended_since_sql(true);
    const std::string plan = plan_of(db, sql, {std::to_string(n_ended - window + 1), "c1"}, err);
    ASSERT_FALSE(plan.empty()) << err;
    EXPECT_NE(plan.find("\"Index Name\": \"sessions_ended\""), std::string::npos)
        << "the survival figure does not use the ended rows' index:\n"
        << plan;
    EXPECT_EQ(plan.find("Seq Scan"), std::string::npos) << plan;
    // Only the '@' sessions (none here) may be read and dropped.
    for (size_t at = plan.find("\"Rows Removed by "); at != std::string::npos;
         at = plan.find("\"Rows Removed by ", at + 1))
        EXPECT_EQ(std::atol(plan.c_str() + plan.find(':', at) + 1), 0) << "it reads rows it throws away:\n" << plan;
    printf(
        "survival figure of one cell (%ld ended rows in the window over 4 cells) over %ld ended and %ld open "
        "sessions: %.2f ms\n",
        window, n_ended, n_open, execution_ms(plan));
}

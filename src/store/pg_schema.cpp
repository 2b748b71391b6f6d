#include "store/pg_schema.h"

#include "store/pg_conn.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace armada::store::pg {

namespace {

// Versioned migrations, applied in order at open. A step is never edited once released: a change
// is a new step. Most run in a transaction each. An index on a table that may already hold
// millions of rows is built CONCURRENTLY instead (outside a transaction): the nodes go on writing
// while it builds, where a plain CREATE INDEX would hold every write until it finished.
struct Migration {
    const char * sql;
    const char * index = nullptr;  // set: the one index this step builds concurrently
};
const Migration kMigrations[] = {
    // 1: sessions with their assignment, the step log, agents, responses, a probe row.
    {R"sql(
CREATE TABLE sessions (
  id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, owner TEXT NOT NULL, state TEXT NOT NULL,
  reason TEXT NOT NULL, data TEXT NOT NULL, created_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL,
  node TEXT NOT NULL DEFAULT '', epoch BIGINT NOT NULL DEFAULT 0);
CREATE INDEX sessions_state_updated ON sessions(state, updated_ms);
CREATE TABLE steps (
  session_id TEXT NOT NULL, seq BIGINT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
  idempotency TEXT NOT NULL, ts_ms BIGINT NOT NULL, PRIMARY KEY (session_id, seq));
CREATE TABLE agents (
  tenant TEXT NOT NULL, id TEXT NOT NULL, spec TEXT NOT NULL, tools TEXT NOT NULL, created_ms BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL, PRIMARY KEY (tenant, id));
CREATE TABLE responses (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, data TEXT NOT NULL, created_ms BIGINT NOT NULL);
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
)sql"},
    // 2: the cell a session belongs to; the cell brain reads its cell's open sessions.
    {R"sql(
ALTER TABLE sessions ADD COLUMN cell TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_cell_state ON sessions(cell, state);
)sql"},
    // 3: tenants with their quotas, and their API keys (hashed), managed through the gateways.
    {R"sql(
CREATE TABLE tenants (
  name TEXT PRIMARY KEY, rpm BIGINT NOT NULL, tpm BIGINT NOT NULL, live_sessions BIGINT NOT NULL,
  kv_bytes BIGINT NOT NULL, created_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL);
CREATE TABLE api_keys (
  id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL REFERENCES tenants(name) ON DELETE CASCADE,
  prefix TEXT NOT NULL, admin BOOLEAN NOT NULL, created_ms BIGINT NOT NULL);
CREATE INDEX sessions_owner_state ON sessions(owner, state);
)sql"},
    // 4: open sessions only, by cell and node: the brains' reconcile and each node's pass read
    // these, and must not wade through the ended ones kept for their retention. The predicate is
    // written exactly as open_where() writes it, so the planner can prove a query may use it.
    {R"sql(
CREATE INDEX CONCURRENTLY IF NOT EXISTS sessions_open ON sessions(cell, node, created_ms)
  WHERE state NOT IN ('completed','failed','cancelled')
)sql",
     "sessions_open"},
    // 5: ended sessions only, by cell and time: each cell brain's survival figure reads its own
    // cell's last hour, and must not wade through every other cell's (`sessions_state_updated`
    // narrows the state and the time, not the cell). The predicate is written as ended_since()
    // writes it.
    {R"sql(
CREATE INDEX CONCURRENTLY IF NOT EXISTS sessions_ended ON sessions(cell, updated_ms)
  WHERE state IN ('completed','failed','cancelled')
)sql",
     "sessions_ended"},
};
constexpr int kLatest = int(sizeof kMigrations / sizeof kMigrations[0]);
// Held (by the session, not a transaction: a concurrent build runs outside one) for the length of
// the migrations, so that nodes starting together apply each once.
constexpr int64_t kMigrationLock = 7152903114;

}  // namespace

int latest_schema() {
    return kLatest;
}

std::string migrate(PGconn * c) {
    auto step = [&](const std::string & sql) -> std::string {
        Res r(PQexec(c, sql.c_str()));
        return r.ok() ? std::string() : error_of(c, r);
    };
    // A migration may index millions of rows: the connection's statement timeout is not for it
    // (RESET below brings back the one it was opened with).
    std::string e = step("SET statement_timeout = 0");
    // Tried, not waited for: a node waiting inside a statement holds a snapshot, and another
    // node's concurrent index build waits for every snapshot older than it to go.
    const std::string lock = "SELECT pg_try_advisory_lock(" + std::to_string(kMigrationLock) + ")";
    const auto wait_began = std::chrono::steady_clock::now();
    auto said = wait_began;
    for (int wait_ms = 50; e.empty();) {
        Res r(PQexec(c, lock.c_str()));
        if (!r.ok()) {
            e = error_of(c, r);
        } else if (r.rows() == 1 && r.text(0, 0) == "t") {
            break;
        } else {
            // Another node migrates (an index on a large table can take minutes): said, not silent.
            const auto now = std::chrono::steady_clock::now();
            if (wait_ms == 50 || now - said >= std::chrono::seconds(30)) {
                said = now;
                spdlog::info("schema migration: waiting for another Armada process that migrates this database ({} s)",
                             std::chrono::duration_cast<std::chrono::seconds>(now - wait_began).count());
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
            wait_ms = std::min(wait_ms * 2, 1000);
        }
    }
    const bool locked = e.empty();
    if (e.empty()) e = step("CREATE TABLE IF NOT EXISTS armada_schema (version INT NOT NULL)");
    int version = 0;
    if (e.empty()) {
        Res r(PQexec(c, "SELECT version FROM armada_schema"));
        if (!r.ok()) {
            e = error_of(c, r);
        } else if (r.rows() == 0) {
            e = step("INSERT INTO armada_schema(version) VALUES (0)");
        } else {
            version = int(r.i64(0, 0));
        }
    }
    if (e.empty() && version > kLatest) {
        e = "the database was written by a newer Armada (schema " + std::to_string(version) + ", this build knows " +
            std::to_string(kLatest) + ")";
    }
    const std::string done = "UPDATE armada_schema SET version = ";
    for (int v = version; e.empty() && v < kLatest; ++v) {
        const Migration & m = kMigrations[v];
        if (m.index) {
            // A concurrent build that failed part-way (a crash, a cancel) leaves an INVALID index
            // of that name, which IF NOT EXISTS would take for done: it goes, and is built again.
            const char * name[] = {m.index};
            Res bad(PQexecParams(c,
                                 "SELECT 1 FROM pg_index i WHERE i.indexrelid = to_regclass($1) AND NOT i.indisvalid",
                                 1, nullptr, name, nullptr, nullptr, 0));
            if (!bad.ok()) e = error_of(c, bad);
            if (e.empty() && bad.rows() > 0) {
                spdlog::warn("schema migration {}: index {} was left invalid by a build that failed; building it again",
                             v + 1, m.index);
                e = step(std::string("DROP INDEX CONCURRENTLY IF EXISTS ") + m.index);
            }
            if (e.empty()) e = step(m.sql);
            // Done and not yet counted (a crash here): the next open finds it there, valid.
            if (e.empty()) e = step(done + std::to_string(v + 1));
        } else {
            e = step("BEGIN");
            if (e.empty()) e = step(m.sql);
            if (e.empty()) e = step(done + std::to_string(v + 1));
            if (e.empty()) e = step("COMMIT");
            if (!e.empty()) PQclear(PQexec(c, "ROLLBACK"));
        }
        if (!e.empty()) e = "schema migration " + std::to_string(v + 1) + ": " + e;
    }
    if (locked) {
        // The connection lives on as the shard's writer: a lock it kept would stop every node
        // that starts later. Not given back: the connection goes, and the lock with it.
        Res r(PQexec(c, ("SELECT pg_advisory_unlock(" + std::to_string(kMigrationLock) + ")").c_str()));
        if (!r.ok() || r.rows() != 1 || r.text(0, 0) != "t") {
            spdlog::warn("schema migration: the migration lock was not given back ({}); reconnecting", error_of(c, r));
            PQreset(c);
            return e;
        }
    }
    PQclear(PQexec(c, "RESET statement_timeout"));
    return e;
}

}  // namespace armada::store::pg

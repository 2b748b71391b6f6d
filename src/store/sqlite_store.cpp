#include "store/sqlite_store.h"

#include <sqlite3.h>

#include <ctime>
#include <filesystem>

namespace armada::store {

namespace {
// Versioned migrations, applied in order at open; PRAGMA user_version records how far a file
// has come. A step is never edited once released: a change is a new step.
const char * kMigrations[] = {
    // 1: sessions and their step log.
    R"sql(
CREATE TABLE IF NOT EXISTS sessions (
  id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, owner TEXT NOT NULL, state TEXT NOT NULL,
  reason TEXT NOT NULL, data TEXT NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS steps (
  session_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
  idempotency TEXT NOT NULL, ts_ms INTEGER NOT NULL, PRIMARY KEY (session_id, seq));
CREATE INDEX IF NOT EXISTS sessions_state ON sessions(state);
)sql",
    // 2: agents get a table of their own, keyed by tenant (they were rows of `sessions` under
    // "agent:<id>"); sessions are found by state and age for start-up and retention; a probe
    // row for readiness.
    R"sql(
CREATE TABLE agents (
  tenant TEXT NOT NULL, id TEXT NOT NULL, spec TEXT NOT NULL, tools TEXT NOT NULL, created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL, PRIMARY KEY (tenant, id));
INSERT OR REPLACE INTO agents(tenant, id, spec, tools, created_ms, updated_ms)
  SELECT owner, substr(id, 7), data, '', created_ms, updated_ms FROM sessions WHERE agent_id = '@agent';
DELETE FROM sessions WHERE agent_id = '@agent';
DROP INDEX IF EXISTS sessions_state;
CREATE INDEX sessions_state_updated ON sessions(state, updated_ms);
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
)sql",
    // 3: stored responses get a table of their own (they were rows of `sessions` under agent
    // "@response"); sessions carry their assignment (node, epoch) for fencing in a cluster.
    R"sql(
CREATE TABLE responses (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, data TEXT NOT NULL, created_ms INTEGER NOT NULL);
INSERT OR REPLACE INTO responses(id, tenant, data, created_ms)
  SELECT id, owner, data, created_ms FROM sessions WHERE agent_id = '@response';
DELETE FROM steps WHERE session_id IN (SELECT id FROM sessions WHERE agent_id = '@response');
DELETE FROM sessions WHERE agent_id = '@response';
ALTER TABLE sessions ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
)sql",
    // 4: the cell a session belongs to in a cluster ("" on a single node).
    R"sql(
ALTER TABLE sessions ADD COLUMN cell TEXT NOT NULL DEFAULT '';
)sql",
};

bool migrate(sqlite3 * db, std::string & err) {
    sqlite3_stmt * q = nullptr;
    int version = 0;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &q, nullptr) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
        version = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    const int latest = int(sizeof kMigrations / sizeof kMigrations[0]);
    if (version > latest) {
        err = "the database was written by a newer Armada (schema " + std::to_string(version) + ", this build knows " +
              std::to_string(latest) + ")";
        return false;
    }
    for (int v = version; v < latest; ++v) {
        const std::string sql = std::string("BEGIN IMMEDIATE;") + kMigrations[v] +
                                "PRAGMA user_version = " + std::to_string(v + 1) + "; COMMIT;";
        char * msg = nullptr;
        if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg) != SQLITE_OK) {
            err = "schema migration " + std::to_string(v + 1) + ": " + (msg ? msg : "sqlite error");
            sqlite3_free(msg);
            sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
            return false;
        }
    }
    return true;
}

std::string errmsg(sqlite3 * db, const char * what) {
    return std::string(what) + ": " + sqlite3_errmsg(db);
}

bool exec(sqlite3 * db, const char * sql, std::string & err) {
    char * msg = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &msg) != SQLITE_OK) {
        err = msg ? msg : "sqlite error";
        sqlite3_free(msg);
        return false;
    }
    return true;
}

//! Owns a prepared statement.
struct Stmt {
    sqlite3_stmt * s = nullptr;
    Stmt(sqlite3 * db, const char * sql) { sqlite3_prepare_v2(db, sql, -1, &s, nullptr); }
    ~Stmt() { sqlite3_finalize(s); }
    void text(int i, const std::string & v) { sqlite3_bind_text(s, i, v.data(), int(v.size()), SQLITE_TRANSIENT); }
    void i64(int i, int64_t v) { sqlite3_bind_int64(s, i, v); }
    std::string col(int i) {
        const auto * p = reinterpret_cast<const char *>(sqlite3_column_text(s, i));
        return p ? std::string(p, size_t(sqlite3_column_bytes(s, i))) : std::string();
    }
};

SessionRecord read_session(Stmt & q) {
    SessionRecord r;
    r.id = q.col(0);
    r.agent_id = q.col(1);
    r.owner = q.col(2);
    r.state = q.col(3);
    r.reason = q.col(4);
    r.data = q.col(5);
    r.created_ms = sqlite3_column_int64(q.s, 6);
    r.updated_ms = sqlite3_column_int64(q.s, 7);
    r.node = q.col(8);
    r.epoch = sqlite3_column_int64(q.s, 9);
    r.cell = q.col(10);
    return r;
}

constexpr const char * kSessionColumns = "id,agent_id,owner,state,reason,data,created_ms,updated_ms,node,epoch,cell";
}  // namespace

std::unique_ptr<SqliteStore> SqliteStore::open(const std::string & dir, std::string & error) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
        error = "cannot create data dir " + dir + ": " + ec.message();
        return nullptr;
    }
    const std::string path = dir + "/armada.db";
    std::unique_ptr<SqliteStore> s(new SqliteStore());
    if (sqlite3_open_v2(path.c_str(), &s->wdb_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK ||
        sqlite3_open_v2(path.c_str(), &s->rdb_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
        error = "cannot open " + path + ": " + (s->wdb_ ? sqlite3_errmsg(s->wdb_) : "out of memory");
        return nullptr;
    }
    sqlite3_busy_timeout(s->wdb_, 5000);
    sqlite3_busy_timeout(s->rdb_, 5000);
    if (!exec(s->wdb_, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", error) || !migrate(s->wdb_, error)) {
        error = path + ": " + error;
        return nullptr;
    }
    s->writer_ = std::thread([p = s.get()] { p->writer_loop(); });
    return s;
}

SqliteStore::~SqliteStore() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (writer_.joinable()) writer_.join();
    sqlite3_close(rdb_);
    sqlite3_close(wdb_);
}

void SqliteStore::commit(Batch batch, std::function<void(Status)> done) {
    {
        std::lock_guard lk(mu_);
        queue_.emplace_back(std::move(batch), std::move(done));
    }
    cv_.notify_one();
}

void SqliteStore::writer_loop() {
    for (;;) {
        std::deque<std::pair<Batch, std::function<void(Status)>>> group;
        std::string sticky;
        {
            std::unique_lock lk(mu_);
            cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty() && stop_) return;
            group.swap(queue_);
            sticky = sticky_;
        }
        Status st = sticky.empty() ? Status::Ok() : Status::Error("store failed earlier: " + sticky);
        std::vector<Status> each(group.size());
        if (st.ok) {
            std::vector<Batch *> ptrs;
            for (auto & g : group)
                ptrs.push_back(&g.first);
            st = apply(ptrs, each);
            last_group_ = group.size();
            if (!st.ok) {
                std::lock_guard lk(mu_);
                sticky_ = st.error;
            }
        }
        for (size_t i = 0; i < group.size(); ++i) {
            if (group[i].second) group[i].second(st.ok ? each[i] : st);
        }
    }
}

Status SqliteStore::apply(const std::vector<Batch *> & group, std::vector<Status> & each) {
    std::string err;
    if (!exec(wdb_, "BEGIN IMMEDIATE", err)) return Status::Error("begin: " + err);
    Stmt up(wdb_,
            "INSERT INTO sessions(id,agent_id,owner,state,reason,data,created_ms,updated_ms,cell) "
            "VALUES(?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET state=excluded.state, reason=excluded.reason, data=excluded.data, "
            "updated_ms=excluded.updated_ms");
    Stmt ins(wdb_, "INSERT INTO steps(session_id,seq,kind,payload,idempotency,ts_ms) VALUES(?,?,?,?,?,?)");
    Stmt del_steps(wdb_, "DELETE FROM steps WHERE session_id=?");
    Stmt del_sess(wdb_, "DELETE FROM sessions WHERE id=?");
    Stmt up_agent(wdb_,
                  "INSERT INTO agents(tenant,id,spec,tools,created_ms,updated_ms) VALUES(?,?,?,?,?,?) "
                  "ON CONFLICT(tenant,id) DO UPDATE SET spec=excluded.spec, tools=excluded.tools, "
                  "updated_ms=excluded.updated_ms");
    Stmt del_agent(wdb_, "DELETE FROM agents WHERE tenant=? AND id=?");
    Stmt up_resp(wdb_,
                 "INSERT INTO responses(id,tenant,data,created_ms) VALUES(?,?,?,?) "
                 "ON CONFLICT(id) DO UPDATE SET data=excluded.data");
    Stmt del_resp(wdb_, "DELETE FROM responses WHERE id=?");
    Stmt fence(wdb_, "SELECT 1 FROM sessions WHERE id=? AND node=? AND epoch=?");
    Stmt assign(wdb_,
                "UPDATE sessions SET node=?, epoch=?, cell=CASE WHEN ?='' THEN cell ELSE ? END WHERE id=? AND epoch<?");
    Stmt probe(wdb_, "INSERT OR REPLACE INTO meta(k,v) VALUES('probe', ?)");
    Stmt lead(wdb_,
              "INSERT INTO meta(k,v) VALUES(?1,?2) ON CONFLICT(k) DO UPDATE SET v=excluded.v "
              "WHERE CAST(meta.v AS INTEGER) <= CAST(excluded.v AS INTEGER)");
    bool ok = up.s && ins.s && del_steps.s && del_sess.s && up_agent.s && del_agent.s && up_resp.s && del_resp.s &&
              fence.s && assign.s && probe.s && lead.s;
    auto run = [&](Stmt & q) {
        ok = ok && sqlite3_step(q.s) == SQLITE_DONE;
        return ok;
    };
    for (size_t bi = 0; bi < group.size() && ok; ++bi) {
        const Batch * b = group[bi];
        // Each batch in its own savepoint: a fenced one is undone alone, the group goes on.
        if (!exec(wdb_, "SAVEPOINT batch", err)) {
            ok = false;
            break;
        }
        std::string fenced;
        bool deposed = false;  // fenced by the leader mark
        if (b->leader.rev > 0) {
            sqlite3_reset(lead.s);
            lead.text(1, "leader:" + b->leader.election);
            lead.text(2, std::to_string(b->leader.rev));
            if (run(lead) && sqlite3_changes(wdb_) == 0) {
                fenced = leader_fenced(b->leader);
                deposed = true;
            }
        }
        for (const auto & f : b->fences) {
            if (!ok || !fenced.empty()) break;
            sqlite3_reset(fence.s);
            fence.text(1, f.session_id);
            fence.text(2, f.node);
            fence.i64(3, f.epoch);
            const int rc = sqlite3_step(fence.s);
            if (rc == SQLITE_DONE) {
                fenced = "session " + f.session_id + " is no longer held by " + f.node + " at epoch " +
                         std::to_string(f.epoch);
                break;
            }
            ok = rc == SQLITE_ROW;
            if (!ok) break;
        }
        sqlite3_reset(fence.s);
        if (ok && fenced.empty()) {
            for (const auto & r : b->sessions) {
                sqlite3_reset(up.s);
                up.text(1, r.id);
                up.text(2, r.agent_id);
                up.text(3, r.owner);
                up.text(4, r.state);
                up.text(5, r.reason);
                up.text(6, r.data);
                up.i64(7, r.created_ms);
                up.i64(8, r.updated_ms);
                up.text(9, r.cell);
                if (!run(up)) break;
            }
            for (const auto & a : b->assign) {
                if (!ok || !fenced.empty()) break;
                sqlite3_reset(assign.s);
                assign.text(1, a.node);
                assign.i64(2, a.epoch);
                assign.text(3, a.cell);
                assign.text(4, a.cell);
                assign.text(5, a.session_id);
                assign.i64(6, a.epoch);
                if (run(assign) && sqlite3_changes(wdb_) == 0)
                    fenced = "session " + a.session_id + " is missing or already at epoch " + std::to_string(a.epoch) +
                             " or later";
            }
            for (const auto & st : b->steps) {
                if (!ok || !fenced.empty()) break;
                sqlite3_reset(ins.s);
                ins.text(1, st.session_id);
                ins.i64(2, st.seq);
                ins.text(3, st.kind);
                ins.text(4, st.payload);
                ins.text(5, st.idempotency);
                ins.i64(6, st.ts_ms);
                run(ins);
            }
            for (const auto & id : b->erase) {
                if (!ok || !fenced.empty()) break;
                sqlite3_reset(del_steps.s);
                del_steps.text(1, id);
                sqlite3_reset(del_sess.s);
                del_sess.text(1, id);
                run(del_steps) && run(del_sess);
            }
            for (const auto & a : b->agents) {
                if (!ok || !fenced.empty()) break;
                sqlite3_reset(up_agent.s);
                up_agent.text(1, a.tenant);
                up_agent.text(2, a.id);
                up_agent.text(3, a.spec);
                up_agent.text(4, a.tools);
                up_agent.i64(5, a.created_ms);
                up_agent.i64(6, a.updated_ms);
                run(up_agent);
            }
            for (const auto & [tenant, id] : b->erase_agents) {
                if (!ok || !fenced.empty()) break;
                sqlite3_reset(del_agent.s);
                del_agent.text(1, tenant);
                del_agent.text(2, id);
                run(del_agent);
            }
            for (const auto & r : b->responses) {
                if (!ok || !fenced.empty()) break;
                sqlite3_reset(up_resp.s);
                up_resp.text(1, r.id);
                up_resp.text(2, r.tenant);
                up_resp.text(3, r.data);
                up_resp.i64(4, r.created_ms);
                run(up_resp);
            }
            for (const auto & id : b->erase_responses) {
                if (!ok || !fenced.empty()) break;
                sqlite3_reset(del_resp.s);
                del_resp.text(1, id);
                run(del_resp);
            }
            if (ok && b->probe) {
                sqlite3_reset(probe.s);
                probe.text(1, std::to_string(time(nullptr)));
                run(probe);
            }
            if (ok && fenced.empty() && b->forget_leaders)
                ok = sqlite3_exec(wdb_, "DELETE FROM meta WHERE k LIKE 'leader:%'", nullptr, nullptr, nullptr) ==
                     SQLITE_OK;
        }
        if (!ok) break;
        if (!fenced.empty()) {
            each[bi] = deposed ? Status::Deposed(fenced) : Status::Fenced(fenced);
            ok = exec(wdb_, "ROLLBACK TO batch", err);
        }
        ok = ok && exec(wdb_, "RELEASE batch", err);
    }
    if (!ok) {
        std::string e = err.empty() ? errmsg(wdb_, "write") : err;
        exec(wdb_, "ROLLBACK", err);
        return Status::Error(e);
    }
    if (!exec(wdb_, "COMMIT", err)) {
        exec(wdb_, "ROLLBACK", err);
        return Status::Error("commit: " + err);
    }
    return Status::Ok();
}

std::optional<SessionRecord> SqliteStore::session(const std::string & id) {
    std::lock_guard lk(rmu_);
    Stmt q(rdb_, (std::string("SELECT ") + kSessionColumns + " FROM sessions WHERE id=?").c_str());
    q.text(1, id);
    if (sqlite3_step(q.s) != SQLITE_ROW) return std::nullopt;
    return read_session(q);
}

std::optional<ResponseRecord> SqliteStore::response(const std::string & id) {
    std::lock_guard lk(rmu_);
    Stmt q(rdb_, "SELECT id,tenant,data,created_ms FROM responses WHERE id=?");
    q.text(1, id);
    if (sqlite3_step(q.s) != SQLITE_ROW) return std::nullopt;
    return ResponseRecord{q.col(0), q.col(1), q.col(2), sqlite3_column_int64(q.s, 3)};
}

std::vector<StepRecord> SqliteStore::steps(const std::string & id) {
    std::lock_guard lk(rmu_);
    Stmt q(rdb_, "SELECT seq,kind,payload,idempotency,ts_ms FROM steps WHERE session_id=? ORDER BY seq");
    q.text(1, id);
    std::vector<StepRecord> out;
    while (sqlite3_step(q.s) == SQLITE_ROW) {
        StepRecord r;
        r.session_id = id;
        r.seq = sqlite3_column_int64(q.s, 0);
        r.kind = q.col(1);
        r.payload = q.col(2);
        r.idempotency = q.col(3);
        r.ts_ms = sqlite3_column_int64(q.s, 4);
        out.push_back(std::move(r));
    }
    return out;
}

namespace {
// "?,?,?" for an IN list of n values.
std::string placeholders(size_t n) {
    std::string p;
    for (size_t i = 0; i < n; ++i)
        p += i ? ",?" : "?";
    return p;
}
}  // namespace

std::vector<SessionRecord> SqliteStore::sessions_not_in(const std::vector<std::string> & ended) {
    std::lock_guard lk(rmu_);
    const std::string sql =
        std::string("SELECT ") + kSessionColumns + " FROM sessions" +
        (ended.empty() ? std::string() : " WHERE state NOT IN (" + placeholders(ended.size()) + ")") +
        " ORDER BY created_ms";
    Stmt q(rdb_, sql.c_str());
    for (size_t i = 0; i < ended.size(); ++i)
        q.text(int(i) + 1, ended[i]);
    std::vector<SessionRecord> out;
    while (sqlite3_step(q.s) == SQLITE_ROW)
        out.push_back(read_session(q));
    return out;
}

std::optional<std::vector<SessionRecord>> SqliteStore::sessions_of(const std::string & owner, const std::string & state,
                                                                   size_t limit) {
    std::lock_guard lk(rmu_);
    const std::string sql = std::string("SELECT ") + kSessionColumns +
                            " FROM sessions WHERE owner=? AND agent_id NOT LIKE '@%'" +
                            (state.empty() ? "" : " AND state=?") + " ORDER BY created_ms DESC, id LIMIT ?";
    Stmt q(rdb_, sql.c_str());
    int i = 1;
    q.text(i++, owner);
    if (!state.empty()) q.text(i++, state);
    q.i64(i, int64_t(std::min<size_t>(limit, 1'000'000)));
    std::vector<SessionRecord> out;
    int rc = SQLITE_ROW;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW)
        out.push_back(read_session(q));
    if (rc != SQLITE_DONE) return std::nullopt;
    return out;
}

std::optional<std::vector<AgentRecord>> SqliteStore::agents() {
    std::lock_guard lk(rmu_);
    Stmt q(rdb_, "SELECT tenant,id,spec,tools,created_ms,updated_ms FROM agents ORDER BY updated_ms");
    std::vector<AgentRecord> out;
    int rc = SQLITE_ROW;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
        AgentRecord a;
        a.tenant = q.col(0);
        a.id = q.col(1);
        a.spec = q.col(2);
        a.tools = q.col(3);
        a.created_ms = sqlite3_column_int64(q.s, 4);
        a.updated_ms = sqlite3_column_int64(q.s, 5);
        out.push_back(std::move(a));
    }
    if (rc != SQLITE_DONE) return std::nullopt;
    return out;
}

std::vector<std::string> SqliteStore::expired(const std::vector<std::string> & states, int64_t before_ms,
                                              size_t limit) {
    if (states.empty()) return {};
    std::lock_guard lk(rmu_);
    const std::string sql =
        "SELECT id FROM sessions WHERE state IN (" + placeholders(states.size()) + ") AND updated_ms < ? LIMIT ?";
    Stmt q(rdb_, sql.c_str());
    int i = 1;
    for (const auto & st : states)
        q.text(i++, st);
    q.i64(i++, before_ms);
    q.i64(i, int64_t(limit));
    std::vector<std::string> out;
    while (sqlite3_step(q.s) == SQLITE_ROW)
        out.push_back(q.col(0));
    return out;
}

std::vector<std::string> SqliteStore::expired_responses(int64_t before_ms, size_t limit) {
    std::lock_guard lk(rmu_);
    Stmt q(rdb_, "SELECT id FROM responses WHERE created_ms < ? LIMIT ?");
    q.i64(1, before_ms);
    q.i64(2, int64_t(limit));
    std::vector<std::string> out;
    while (sqlite3_step(q.s) == SQLITE_ROW)
        out.push_back(q.col(0));
    return out;
}

std::vector<Store::MinuteCount> SqliteStore::count_since(const std::vector<std::string> & states, int64_t since_ms) {
    if (states.empty()) return {};
    std::lock_guard lk(rmu_);
    const std::string sql = "SELECT state, updated_ms / 60000, count(*) FROM sessions WHERE state IN (" +
                            placeholders(states.size()) +
                            ") AND updated_ms >= ? AND agent_id NOT LIKE '@%' GROUP BY state, updated_ms / 60000";
    Stmt q(rdb_, sql.c_str());
    int i = 1;
    for (const auto & st : states)
        q.text(i++, st);
    q.i64(i, since_ms);
    std::vector<MinuteCount> out;
    while (sqlite3_step(q.s) == SQLITE_ROW)
        out.push_back({q.col(0), sqlite3_column_int64(q.s, 1), sqlite3_column_int64(q.s, 2)});
    return out;
}

std::optional<std::vector<Store::EndedCount>> SqliteStore::ended_since(const std::string & cell, int64_t since_ms) {
    std::lock_guard lk(rmu_);
    const std::string sql =
        "SELECT cell, state, reason LIKE 'deadline%', epoch > 1, count(*) FROM sessions "
        "WHERE state IN ('completed','failed','cancelled') AND updated_ms >= ? AND agent_id NOT LIKE '@%'" +
        std::string(cell.empty() ? "" : " AND cell = ?") + " GROUP BY 1, 2, 3, 4";
    Stmt q(rdb_, sql.c_str());
    q.i64(1, since_ms);
    if (!cell.empty()) q.text(2, cell);
    std::vector<EndedCount> out;
    while (sqlite3_step(q.s) == SQLITE_ROW) {
        out.push_back({q.col(0), q.col(1), sqlite3_column_int64(q.s, 2) != 0, sqlite3_column_int64(q.s, 3) != 0,
                       sqlite3_column_int64(q.s, 4)});
    }
    return out;
}

Status SqliteStore::writable() {
    std::lock_guard lk(mu_);
    return sticky_.empty() ? Status::Ok() : Status::Error("store failed: " + sticky_);
}

Status SqliteStore::recover() {
    std::string err;
    if (!exec(wdb_, "SELECT count(*) FROM sessions", err)) return Status::Error(err);
    std::lock_guard lk(mu_);
    sticky_.clear();
    return Status::Ok();
}

}  // namespace armada::store

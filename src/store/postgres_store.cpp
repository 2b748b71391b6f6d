#include "store/postgres_store.h"

#include <libpq-fe.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <set>
#include <thread>
#include <tuple>

namespace armada::store {

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

constexpr const char * kSessionColumns = "id,agent_id,owner,state,reason,data,created_ms,updated_ms,node,epoch,cell";

//! Owns a PGresult.
struct Res {
    PGresult * r = nullptr;
    std::string failure;  // set when the server did not answer in time (then r may be null)
    Res() = default;
    explicit Res(PGresult * p) : r(p) {}
    Res(Res && o) noexcept : r(o.r), failure(std::move(o.failure)) { o.r = nullptr; }
    Res & operator=(Res && o) noexcept {
        std::swap(r, o.r);
        std::swap(failure, o.failure);
        return *this;
    }
    ~Res() { PQclear(r); }
    bool ok() const {
        const auto s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
        return s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK;
    }
    int rows() const { return r ? PQntuples(r) : 0; }
    std::string text(int row, int col) const {
        return std::string(PQgetvalue(r, row, col), size_t(PQgetlength(r, row, col)));
    }
    int64_t i64(int row, int col) const { return std::strtoll(PQgetvalue(r, row, col), nullptr, 10); }
    int64_t affected() const { return r ? std::strtoll(PQcmdTuples(r), nullptr, 10) : 0; }
};

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
        s.pop_back();
    return s;
}

std::string error_of(PGconn * c, const Res & r) {
    if (!r.failure.empty()) return r.failure;
    std::string e = r.r ? PQresultErrorMessage(r.r) : "";
    if (e.empty()) e = PQerrorMessage(c);
    return trim(e);
}

//! Runs `sql` with text parameters, waiting at most `timeout_ms` (0: no limit) for the answer. A
//! server that accepts and never answers (hung, or cut off without a reset) is given up on: the
//! connection is shut down, so it reads as broken and is reset before its next use.
Res run(PGconn * c, const std::string & sql, const std::vector<std::string> & params = {}, int timeout_ms = 0) {
    std::vector<const char *> v;
    v.reserve(params.size());
    for (const auto & p : params)
        v.push_back(p.c_str());
    if (timeout_ms <= 0)
        return Res(PQexecParams(c, sql.c_str(), int(v.size()), nullptr, v.data(), nullptr, nullptr, 0));
    while (PGresult * left = PQgetResult(c))  // nothing may be pending from before
        PQclear(left);
    if (!PQsendQueryParams(c, sql.c_str(), int(v.size()), nullptr, v.data(), nullptr, nullptr, 0)) return Res();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string failure;
    while (PQconsumeInput(c) && PQisBusy(c)) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
        if (left <= 0) {
            failure = "PostgreSQL did not answer within " + std::to_string(timeout_ms) +
                      " ms (the server hangs, or the network to it does); the connection is reset";
            ::shutdown(PQsocket(c), SHUT_RDWR);
            PQconsumeInput(c);  // sees the shut-down socket: the connection is now broken
            break;
        }
        pollfd p{PQsocket(c), POLLIN, 0};
        ::poll(&p, 1, int(std::min<int64_t>(left, 1000)));
    }
    Res out;
    while (PGresult * r = PQgetResult(c)) {
        if (out.r && PQresultStatus(out.r) == PGRES_FATAL_ERROR) {
            PQclear(r);  // the first error is the one to report
            continue;
        }
        out = Res(r);
    }
    out.failure = std::move(failure);
    if (!out.failure.empty()) {
        PQclear(out.r);
        out.r = nullptr;
    }
    return out;
}

//! libpq's settings for every connection, before the URL's own (which win): TCP keepalives and a
//! user timeout, so a peer that vanishes without a reset is noticed in seconds, and a statement
//! timeout on the server's side.
PGconn * connect(const std::string & url, int timeout_s, int statement_timeout_ms) {
    const std::string t = std::to_string(timeout_s);
    const std::string options = "-c statement_timeout=" + std::to_string(statement_timeout_ms);
    const char * keys[] = {
        "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
        "options",    "dbname",          "connect_timeout",     "application_name", nullptr};
    const char * vals[] = {"1", "10", "3", "3", "15000", options.c_str(), url.c_str(), t.c_str(), "armada", nullptr};
    PGconn * c = PQconnectdbParams(keys, vals, 1);
    // Server notices ("relation already exists, skipping") are not errors: keep them out of logs.
    if (c)
        PQsetNoticeProcessor(
            c, [](void *, const char *) {}, nullptr);
    return c;
}

//! A connection string with any password left out, for messages.
std::string redact(const std::string & url) {
    const auto scheme = url.find("://");
    const auto at = url.find('@');
    if (scheme == std::string::npos || at == std::string::npos || at < scheme) return url;
    const auto colon = url.find(':', scheme + 3);
    if (colon == std::string::npos || colon > at) return url;
    return url.substr(0, colon) + ":***" + url.substr(at);
}

std::string in_list(size_t n, size_t first) {
    std::string p;
    for (size_t i = 0; i < n; ++i)
        p += (i ? ",$" : "$") + std::to_string(first + i);
    return p;
}

SessionRecord read_session(const Res & q, int row) {
    SessionRecord r;
    r.id = q.text(row, 0);
    r.agent_id = q.text(row, 1);
    r.owner = q.text(row, 2);
    r.state = q.text(row, 3);
    r.reason = q.text(row, 4);
    r.data = q.text(row, 5);
    r.created_ms = q.i64(row, 6);
    r.updated_ms = q.i64(row, 7);
    r.node = q.text(row, 8);
    r.epoch = q.i64(row, 9);
    r.cell = q.text(row, 10);
    return r;
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
    for (int wait_ms = 50; e.empty();) {
        Res r(PQexec(c, lock.c_str()));
        if (!r.ok()) {
            e = error_of(c, r);
        } else if (r.rows() == 1 && r.text(0, 0) == "t") {
            break;
        } else {
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
    if (locked) PQclear(PQexec(c, ("SELECT pg_advisory_unlock(" + std::to_string(kMigrationLock) + ")").c_str()));
    PQclear(PQexec(c, "RESET statement_timeout"));
    return e;
}

}  // namespace

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
    Res query(const std::string & sql, const std::vector<std::string> & params = {}) {
        Res r = run(c_, sql, params, s_->query_timeout_ms);
        if (!r.ok() && r.failure.empty() && PQstatus(c_) == CONNECTION_BAD) {
            PQreset(c_);
            {
                std::lock_guard lk(s_->pmu);
                s_->stats.reconnects++;
            }
            if (PQstatus(c_) == CONNECTION_OK) r = run(c_, sql, params, s_->query_timeout_ms);
        }
        if (!r.ok()) spdlog::warn("postgres shard {}: read failed: {}", s_->index, error_of(c_, r));
        return r;
    }

  private:
    Shard * s_;
    PGconn * c_;
};

int PostgresStore::schema_version() {
    return kLatest;
}

std::unique_ptr<PostgresStore> PostgresStore::open(const PostgresConfig & cfg, std::string & error) {
    if (cfg.urls.empty()) {
        error = "no PostgreSQL database given";
        return nullptr;
    }
    if (cfg.read_connections < 1) {
        error = "the PostgreSQL read pool needs at least one connection";
        return nullptr;
    }
    std::unique_ptr<PostgresStore> s(new PostgresStore());
    s->cfg_ = cfg;
    for (size_t i = 0; i < cfg.urls.size(); ++i) {
        auto sh = std::make_unique<Shard>();
        sh->index = i;
        sh->url = cfg.urls[i];
        // The server ends a statement at its timeout; the client waits a little longer for that
        // answer, and gives up on a server that gives none.
        sh->query_timeout_ms =
            cfg.statement_timeout_ms > 0 ? cfg.statement_timeout_ms + std::max(0, cfg.client_grace_ms) : 0;
        const std::string where = "PostgreSQL " + redact(sh->url);
        sh->wconn = connect(sh->url, cfg.connect_timeout_s, cfg.statement_timeout_ms);
        if (PQstatus(sh->wconn) != CONNECTION_OK) {
            error = "cannot connect to " + where + ": " + trim(PQerrorMessage(sh->wconn));
            return nullptr;
        }
        if (auto e = migrate(sh->wconn); !e.empty()) {
            error = where + ": " + e;
            return nullptr;
        }
        // The read pool is opened and checked now, not at the first request under load.
        for (int k = 0; k < cfg.read_connections; ++k) {
            PGconn * c = connect(sh->url, cfg.connect_timeout_s, cfg.statement_timeout_ms);
            sh->all.push_back(c);
            Res r(PQstatus(c) == CONNECTION_OK ? PQexec(c, "SELECT 1") : nullptr);
            if (!r.ok()) {
                error = "cannot open read connection " + std::to_string(k + 1) + " to " + where + ": " +
                        trim(PQerrorMessage(c));
                return nullptr;
            }
            sh->free.push_back(c);
        }
        sh->stats.size = sh->all.size();
        s->shards_.push_back(std::move(sh));
    }
    for (auto & sh : s->shards_)
        sh->writer = std::thread([p = s.get(), sh = sh.get()] { p->writer_loop(*sh); });
    return s;
}

PostgresStore::~PostgresStore() {
    for (auto & sh : shards_) {
        {
            std::lock_guard lk(sh->mu);
            sh->stop = true;
        }
        sh->cv.notify_all();
    }
    for (auto & sh : shards_)
        if (sh->writer.joinable()) sh->writer.join();
}

size_t PostgresStore::shard_of(const std::string & id) const {
    if (shards_.size() <= 1) return 0;
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: stable across builds and machines
    for (unsigned char ch : id)
        h = (h ^ ch) * 0x100000001b3ull;
    return size_t(h % shards_.size());
}

PostgresStore::Lease PostgresStore::acquire(Shard & s) {
    std::unique_lock lk(s.pmu);
    s.stats.acquired++;
    if (s.free.empty()) {
        s.stats.waited++;
        const auto t0 = std::chrono::steady_clock::now();
        const bool got =
            s.pcv.wait_for(lk, std::chrono::milliseconds(cfg_.pool_wait_ms), [&] { return !s.free.empty(); });
        s.stats.wait_us += uint64_t(
            std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
        if (!got) {
            s.stats.timeouts++;
            spdlog::warn("postgres shard {}: no read connection free after {} ms (pool of {})", s.index,
                         cfg_.pool_wait_ms, s.all.size());
            return Lease(&s, nullptr);
        }
    }
    PGconn * c = s.free.back();
    s.free.pop_back();
    s.stats.in_use++;
    return Lease(&s, c);
}

std::optional<PoolStats> PostgresStore::pool_stats() const {
    PoolStats t;
    for (const auto & sh : shards_) {
        std::lock_guard lk(sh->pmu);
        t.size += sh->stats.size;
        t.in_use += sh->stats.in_use;
        t.acquired += sh->stats.acquired;
        t.waited += sh->stats.waited;
        t.wait_us += sh->stats.wait_us;
        t.timeouts += sh->stats.timeouts;
        t.reconnects += sh->stats.reconnects;
    }
    return t;
}

void PostgresStore::commit(Batch batch, std::function<void(Status)> done) {
    // Split by shard. Most batches concern one session and land on one shard.
    std::map<size_t, Batch> parts;
    for (auto & r : batch.sessions)
        parts[shard_of(r.id)].sessions.push_back(std::move(r));
    for (auto & r : batch.steps)
        parts[shard_of(r.session_id)].steps.push_back(std::move(r));
    for (auto & id : batch.erase)
        parts[shard_of(id)].erase.push_back(std::move(id));
    for (auto & a : batch.agents)
        parts[0].agents.push_back(std::move(a));
    for (auto & a : batch.erase_agents)
        parts[0].erase_agents.push_back(std::move(a));
    for (auto & r : batch.responses)
        parts[shard_of(r.id)].responses.push_back(std::move(r));
    for (auto & id : batch.erase_responses)
        parts[shard_of(id)].erase_responses.push_back(std::move(id));
    for (auto & f : batch.fences)
        parts[shard_of(f.session_id)].fences.push_back(std::move(f));
    for (auto & a : batch.assign)
        parts[shard_of(a.session_id)].assign.push_back(std::move(a));
    if (batch.probe) {
        for (size_t i = 0; i < shards_.size(); ++i)
            parts[i].probe = true;
    }
    if (parts.empty()) parts[0];
    if (batch.leader.rev > 0) {
        for (auto & [i, part] : parts)
            part.leader = batch.leader;
    }
    for (auto & [i, part] : parts)
        part.forget_leaders = batch.forget_leaders;

    struct Join {
        std::mutex mu;
        size_t left = 0;
        Status st;
        std::function<void(Status)> done;
    };
    auto join = std::make_shared<Join>();
    join->left = parts.size();
    join->done = std::move(done);
    for (auto & [i, part] : parts) {
        Shard & sh = *shards_[i];
        {
            std::lock_guard lk(sh.mu);
            sh.queue.emplace_back(std::move(part), [join](Status s) {
                std::function<void(Status)> fire;
                Status st;
                {
                    std::lock_guard lk(join->mu);
                    // An error outranks a fence; the first of each kind is kept.
                    if (!s.ok && (join->st.ok || (join->st.fenced && !s.fenced))) join->st = s;
                    if (--join->left == 0) {
                        fire = std::move(join->done);
                        st = join->st;
                    }
                }
                if (fire) fire(st);
            });
        }
        sh.cv.notify_one();
    }
}

void PostgresStore::writer_loop(Shard & s) {
    for (;;) {
        std::deque<std::pair<Batch, std::function<void(Status)>>> group;
        std::string sticky;
        {
            std::unique_lock lk(s.mu);
            s.cv.wait(lk, [&] { return s.stop || !s.queue.empty(); });
            if (s.queue.empty() && s.stop) return;
            group.swap(s.queue);
            sticky = s.sticky;
        }
        Status st = sticky.empty() ? Status::Ok() : Status::Error("store failed earlier: " + sticky);
        std::vector<Status> each(group.size());
        if (st.ok) {
            std::vector<Batch *> ptrs;
            for (auto & g : group)
                ptrs.push_back(&g.first);
            std::string e;
            {
                std::lock_guard lk(s.wmu);
                e = apply(s, ptrs, each);
            }
            if (s.index == 0) last_group_ = group.size();
            if (!e.empty()) {
                st = Status::Error("PostgreSQL shard " + std::to_string(s.index) + ": " + e);
                spdlog::error("store: {}", st.error);
                std::lock_guard lk(s.mu);
                s.sticky = st.error;
            }
        }
        for (size_t i = 0; i < group.size(); ++i) {
            if (group[i].second) group[i].second(st.ok ? each[i] : st);
        }
    }
}

std::string PostgresStore::apply(Shard & s, const std::vector<Batch *> & group, std::vector<Status> & each) {
    PGconn * c = s.wconn;
    if (PQstatus(c) != CONNECTION_OK) {
        PQreset(c);
        if (PQstatus(c) != CONNECTION_OK) return "cannot reach the server: " + trim(PQerrorMessage(c));
    }
    std::string err;
    auto exec = [&](const std::string & sql, const std::vector<std::string> & params = {}) -> Res {
        if (!err.empty()) return Res();  // the transaction failed: nothing more goes to the server
        Res r = run(c, sql, params, s.query_timeout_ms);
        if (!r.ok() && err.empty()) err = error_of(c, r);
        return r;
    };
    exec("BEGIN");
    for (size_t bi = 0; bi < group.size() && err.empty(); ++bi) {
        const Batch & b = *group[bi];
        exec("SAVEPOINT batch");
        std::string fenced;
        bool deposed = false;  // fenced by the leader mark
        // Fencing: a fenced session's row and steps are each written by one statement that holds
        // only while the row still names this node and epoch, and that locks the row until COMMIT
        // (a newer assignment waits for this batch, or came first and the write does nothing).
        std::map<std::string, const Assignment *> fence_of;
        for (const auto & f : b.fences)
            fence_of[f.session_id] = &f;
        std::set<std::string> written;  // fenced sessions some statement of the batch checked
        auto fence_failed = [&](const Assignment & f) {
            fenced =
                "session " + f.session_id + " is no longer held by " + f.node + " at epoch " + std::to_string(f.epoch);
        };
        if (err.empty() && b.leader.rev > 0) {
            // The leader's mark, raised to this one's, locked until COMMIT: a brain whose
            // successor wrote first changes nothing.
            Res r = exec(
                "INSERT INTO meta(k,v) VALUES($1,$2) ON CONFLICT (k) DO UPDATE SET v=EXCLUDED.v "
                "WHERE meta.v::bigint <= EXCLUDED.v::bigint",
                {"leader:" + b.leader.election, std::to_string(b.leader.rev)});
            if (err.empty() && r.affected() == 0) {
                fenced = leader_fenced(b.leader);
                deposed = true;
            }
        }
        if (err.empty() && fenced.empty()) {
            for (const auto & r : b.sessions) {
                if (!err.empty() || !fenced.empty()) break;
                auto f = fence_of.find(r.id);
                if (f == fence_of.end()) {
                    exec(
                        "INSERT INTO sessions(id,agent_id,owner,state,reason,data,created_ms,updated_ms,cell) "
                        "VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9) ON CONFLICT (id) DO UPDATE SET state=EXCLUDED.state, "
                        "reason=EXCLUDED.reason, data=EXCLUDED.data, updated_ms=EXCLUDED.updated_ms",
                        {r.id, r.agent_id, r.owner, r.state, r.reason, r.data, std::to_string(r.created_ms),
                         std::to_string(r.updated_ms), r.cell});
                    continue;
                }
                Res u = exec(
                    "UPDATE sessions SET state=$2, reason=$3, data=$4, updated_ms=$5 "
                    "WHERE id=$1 AND node=$6 AND epoch=$7",
                    {r.id, r.state, r.reason, r.data, std::to_string(r.updated_ms), f->second->node,
                     std::to_string(f->second->epoch)});
                written.insert(r.id);
                if (err.empty() && u.affected() == 0) fence_failed(*f->second);
            }
        }
        if (err.empty() && fenced.empty()) {
            for (const auto & a : b.assign) {
                if (!err.empty() || !fenced.empty()) break;
                Res r = exec(
                    "UPDATE sessions SET node=$1, epoch=$2, cell=COALESCE(NULLIF($4,''), cell) "
                    "WHERE id=$3 AND epoch<$2",
                    {a.node, std::to_string(a.epoch), a.session_id, a.cell});
                if (err.empty() && r.affected() == 0)
                    fenced = "session " + a.session_id + " is missing or already at epoch " + std::to_string(a.epoch) +
                             " or later";
            }
            for (const auto & st : b.steps) {
                if (!err.empty() || !fenced.empty()) break;
                // A batch repeated after a COMMIT whose answer was lost finds its steps there:
                // the same entry again is fine, a different one at that index never is.
                std::vector<std::string> params{st.session_id, std::to_string(st.seq), st.kind,
                                                st.payload,    st.idempotency,         std::to_string(st.ts_ms)};
                auto f = fence_of.find(st.session_id);
                Res r;
                if (f == fence_of.end()) {
                    r = exec(
                        "INSERT INTO steps(session_id,seq,kind,payload,idempotency,ts_ms) "
                        "VALUES($1,$2,$3,$4,$5,$6) ON CONFLICT (session_id, seq) DO NOTHING",
                        params);
                } else {
                    // One statement: the step goes in only while its session is this writer's.
                    params.push_back(f->second->node);
                    params.push_back(std::to_string(f->second->epoch));
                    r = exec(
                        "INSERT INTO steps(session_id,seq,kind,payload,idempotency,ts_ms) "
                        "SELECT $1,$2,$3,$4,$5,$6 FROM sessions WHERE id=$1 AND node=$7 AND epoch=$8 FOR UPDATE "
                        "ON CONFLICT (session_id, seq) DO NOTHING",
                        params);
                    written.insert(st.session_id);
                    if (err.empty() && r.affected() == 0) {
                        // Refused, or that index holds an entry already (judged below).
                        Res held = exec("SELECT 1 FROM sessions WHERE id=$1 AND node=$2 AND epoch=$3",
                                        {st.session_id, f->second->node, std::to_string(f->second->epoch)});
                        if (err.empty() && held.rows() == 0) {
                            fence_failed(*f->second);
                            break;
                        }
                    }
                }
                if (err.empty() && r.affected() == 0) {
                    Res old = exec("SELECT kind, payload FROM steps WHERE session_id=$1 AND seq=$2",
                                   {st.session_id, std::to_string(st.seq)});
                    if (err.empty() && (old.rows() != 1 || old.text(0, 0) != st.kind || old.text(0, 1) != st.payload))
                        err = "step " + std::to_string(st.seq) + " of session " + st.session_id +
                              " already holds a different entry";
                }
            }
            for (const auto & f : b.fences) {
                if (!err.empty() || !fenced.empty()) break;
                if (written.count(f.session_id)) continue;
                // A fenced batch that writes nothing of its session: the check on its own.
                Res r = exec("SELECT 1 FROM sessions WHERE id=$1 AND node=$2 AND epoch=$3 FOR UPDATE",
                             {f.session_id, f.node, std::to_string(f.epoch)});
                if (err.empty() && r.rows() == 0) fence_failed(f);
            }
            for (const auto & id : b.erase) {
                if (!err.empty() || !fenced.empty()) break;
                exec("DELETE FROM steps WHERE session_id=$1", {id});
                exec("DELETE FROM sessions WHERE id=$1", {id});
            }
            for (const auto & a : b.agents) {
                if (!err.empty() || !fenced.empty()) break;
                exec(
                    "INSERT INTO agents(tenant,id,spec,tools,created_ms,updated_ms) VALUES($1,$2,$3,$4,$5,$6) "
                    "ON CONFLICT (tenant,id) DO UPDATE SET spec=EXCLUDED.spec, tools=EXCLUDED.tools, "
                    "updated_ms=EXCLUDED.updated_ms",
                    {a.tenant, a.id, a.spec, a.tools, std::to_string(a.created_ms), std::to_string(a.updated_ms)});
            }
            for (const auto & [tenant, id] : b.erase_agents) {
                if (!err.empty() || !fenced.empty()) break;
                exec("DELETE FROM agents WHERE tenant=$1 AND id=$2", {tenant, id});
            }
            for (const auto & r : b.responses) {
                if (!err.empty() || !fenced.empty()) break;
                exec(
                    "INSERT INTO responses(id,tenant,data,created_ms) VALUES($1,$2,$3,$4) "
                    "ON CONFLICT (id) DO UPDATE SET data=EXCLUDED.data",
                    {r.id, r.tenant, r.data, std::to_string(r.created_ms)});
            }
            for (const auto & id : b.erase_responses) {
                if (!err.empty() || !fenced.empty()) break;
                exec("DELETE FROM responses WHERE id=$1", {id});
            }
            if (err.empty() && fenced.empty() && b.probe) {
                exec("INSERT INTO meta(k,v) VALUES('probe',$1) ON CONFLICT (k) DO UPDATE SET v=EXCLUDED.v",
                     {std::to_string(time(nullptr))});
            }
            if (err.empty() && fenced.empty() && b.forget_leaders) exec("DELETE FROM meta WHERE k LIKE 'leader:%'");
        }
        if (!err.empty()) break;
        if (!fenced.empty()) {
            each[bi] = deposed ? Status::Deposed(fenced) : Status::Fenced(fenced);
            exec("ROLLBACK TO SAVEPOINT batch");
        }
        exec("RELEASE SAVEPOINT batch");
    }
    if (err.empty()) exec("COMMIT");
    if (!err.empty()) {
        if (PQstatus(c) == CONNECTION_OK) run(c, "ROLLBACK", {}, s.query_timeout_ms);  // a hung server: bounded
        return err;
    }
    return {};
}

std::optional<SessionRecord> PostgresStore::session(const std::string & id) {
    auto l = acquire(*shards_[shard_of(id)]);
    if (!l) return std::nullopt;
    Res r = l.query(std::string("SELECT ") + kSessionColumns + " FROM sessions WHERE id=$1", {id});
    if (!r.ok() || r.rows() == 0) return std::nullopt;
    return read_session(r, 0);
}

std::optional<bool> PostgresStore::has_session(const std::string & id) {
    auto l = acquire(*shards_[shard_of(id)]);
    if (!l) return std::nullopt;
    Res r = l.query("SELECT 1 FROM sessions WHERE id=$1", {id});
    if (!r.ok()) return std::nullopt;
    return r.rows() > 0;
}

std::optional<ResponseRecord> PostgresStore::response(const std::string & id) {
    auto l = acquire(*shards_[shard_of(id)]);
    if (!l) return std::nullopt;
    Res r = l.query("SELECT id,tenant,data,created_ms FROM responses WHERE id=$1", {id});
    if (!r.ok() || r.rows() == 0) return std::nullopt;
    return ResponseRecord{r.text(0, 0), r.text(0, 1), r.text(0, 2), r.i64(0, 3)};
}

std::vector<StepRecord> PostgresStore::steps(const std::string & id) {
    auto l = acquire(*shards_[shard_of(id)]);
    if (!l) return {};
    Res r = l.query("SELECT seq,kind,payload,idempotency,ts_ms FROM steps WHERE session_id=$1 ORDER BY seq", {id});
    std::vector<StepRecord> out;
    if (!r.ok()) return out;
    for (int i = 0; i < r.rows(); ++i) {
        StepRecord s;
        s.session_id = id;
        s.seq = r.i64(i, 0);
        s.kind = r.text(i, 1);
        s.payload = r.text(i, 2);
        s.idempotency = r.text(i, 3);
        s.ts_ms = r.i64(i, 4);
        out.push_back(std::move(s));
    }
    return out;
}

namespace {
//! The states that end a session, in the order the `sessions_open` index names them.
const std::vector<std::string> kIndexedEnded = {"completed", "failed", "cancelled"};
}  // namespace

std::string PostgresStore::open_where(const std::vector<std::string> & ended, size_t & first_param) {
    if (ended.empty()) return "TRUE";
    std::vector<std::string> sorted = ended, indexed = kIndexedEnded;
    std::sort(sorted.begin(), sorted.end());
    std::sort(indexed.begin(), indexed.end());
    if (sorted == indexed) return "state NOT IN ('completed','failed','cancelled')";  // the index's own words
    std::string w = "state NOT IN (" + in_list(ended.size(), first_param) + ")";
    first_param += ended.size();
    return w;
}

std::string PostgresStore::open_sessions_sql(const std::vector<std::string> & ended, bool by_node,
                                             size_t & params_used) {
    size_t next = 1;
    std::string sql = std::string("SELECT ") + kSessionColumns + " FROM sessions WHERE " + open_where(ended, next);
    sql += " AND cell=$" + std::to_string(next++);
    if (by_node) sql += " AND node=$" + std::to_string(next++);
    params_used = next - 1;
    return sql + " ORDER BY created_ms";
}

std::vector<SessionRecord> PostgresStore::sessions_not_in(const std::vector<std::string> & ended) {
    size_t next = 1;
    const std::string where = open_where(ended, next);
    return select_open(
               std::string("SELECT ") + kSessionColumns + " FROM sessions WHERE " + where + " ORDER BY created_ms",
               next > 1 ? ended : std::vector<std::string>{})
        .value_or(std::vector<SessionRecord>{});
}

std::optional<std::vector<SessionRecord>> PostgresStore::open_sessions(const std::string & cell,
                                                                       const std::string & node,
                                                                       const std::vector<std::string> & ended) {
    // Through the `sessions_open` index: open rows only, narrowed by cell (and node).
    size_t used = 0;
    const std::string sql = open_sessions_sql(ended, !node.empty(), used);
    std::vector<std::string> params;
    if (used > (node.empty() ? 1u : 2u)) params = ended;  // the states went as parameters
    params.push_back(cell);
    if (!node.empty()) params.push_back(node);
    return select_open(sql, params);
}

std::optional<std::vector<SessionRecord>> PostgresStore::sessions_of(const std::string & owner,
                                                                     const std::string & state, size_t limit) {
    // Each shard's newest `limit` through `sessions_owner_state`, then the newest `limit` of those.
    const std::string n = std::to_string(std::min<size_t>(limit, 1'000'000));
    std::string sql =
        std::string("SELECT ") + kSessionColumns + " FROM sessions WHERE owner=$1 AND agent_id NOT LIKE '@%'";
    std::vector<std::string> params{owner};
    if (!state.empty()) {
        sql += " AND state=$2";
        params.push_back(state);
    }
    sql += " ORDER BY created_ms DESC, id LIMIT " + n;
    std::vector<SessionRecord> out;
    for (auto & sh : shards_) {
        auto l = acquire(*sh);
        if (!l) return std::nullopt;
        Res r = l.query(sql, params);
        if (!r.ok()) return std::nullopt;
        for (int i = 0; i < r.rows(); ++i)
            out.push_back(read_session(r, i));
    }
    std::stable_sort(out.begin(), out.end(), [](const SessionRecord & a, const SessionRecord & b) {
        return a.created_ms != b.created_ms ? a.created_ms > b.created_ms : a.id < b.id;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
}

std::optional<std::vector<SessionRecord>> PostgresStore::select_open(const std::string & sql,
                                                                     const std::vector<std::string> & params) {
    std::vector<SessionRecord> out;
    bool failed = false;
    for (auto & sh : shards_) {
        auto l = acquire(*sh);
        if (!l) {
            failed = true;
            continue;
        }
        Res r = l.query(sql, params);
        failed = failed || !r.ok();
        for (int i = 0; r.ok() && i < r.rows(); ++i)
            out.push_back(read_session(r, i));
    }
    if (failed) return std::nullopt;
    std::stable_sort(out.begin(), out.end(),
                     [](const SessionRecord & a, const SessionRecord & b) { return a.created_ms < b.created_ms; });
    return out;
}

std::optional<std::vector<AgentRecord>> PostgresStore::agents() {
    auto l = acquire(*shards_[0]);
    if (!l) return std::nullopt;
    Res r = l.query("SELECT tenant,id,spec,tools,created_ms,updated_ms FROM agents ORDER BY updated_ms");
    if (!r.ok()) return std::nullopt;
    std::vector<AgentRecord> out;
    for (int i = 0; i < r.rows(); ++i)
        out.push_back({r.text(i, 0), r.text(i, 1), r.text(i, 2), r.text(i, 3), r.i64(i, 4), r.i64(i, 5)});
    return out;
}

template <class Take>
bool PostgresStore::on_every_shard(const std::string & sql, const std::vector<std::string> & params, Take && take) {
    for (auto & sh : shards_) {
        auto l = acquire(*sh);
        if (!l) return false;
        Res r = l.query(sql, params);
        if (!r.ok()) return false;
        take(r);
    }
    return true;
}

std::optional<std::vector<std::string>> PostgresStore::open_ids_of(const std::string & owner,
                                                                   const std::vector<std::string> & ended) {
    std::vector<std::string> params = {owner};
    params.insert(params.end(), ended.begin(), ended.end());
    std::string sql = "SELECT id FROM sessions WHERE owner = $1 AND agent_id NOT LIKE '@%'";
    if (!ended.empty()) sql += " AND state NOT IN (" + in_list(ended.size(), 2) + ")";
    std::vector<std::string> out;
    const bool all = on_every_shard(sql, params, [&](const Res & r) {
        for (int i = 0; i < r.rows(); ++i)
            out.push_back(r.text(i, 0));
    });
    if (!all) return std::nullopt;
    return out;
}

std::optional<std::vector<TenantRecord>> PostgresStore::tenants() {
    auto l = acquire(*shards_[0]);
    if (!l) return std::nullopt;
    Res r = l.query("SELECT name,rpm,tpm,live_sessions,kv_bytes,created_ms,updated_ms FROM tenants ORDER BY name");
    if (!r.ok()) return std::nullopt;
    std::vector<TenantRecord> out;
    for (int i = 0; i < r.rows(); ++i)
        out.push_back({r.text(i, 0), r.i64(i, 1), r.i64(i, 2), r.i64(i, 3), r.i64(i, 4), r.i64(i, 5), r.i64(i, 6)});
    return out;
}

std::optional<std::vector<KeyRecord>> PostgresStore::keys() {
    auto l = acquire(*shards_[0]);
    if (!l) return std::nullopt;
    Res r = l.query("SELECT id,hash,tenant,prefix,admin,created_ms FROM api_keys ORDER BY tenant, created_ms");
    if (!r.ok()) return std::nullopt;
    std::vector<KeyRecord> out;
    for (int i = 0; i < r.rows(); ++i)
        out.push_back({r.text(i, 0), r.text(i, 1), r.text(i, 2), r.text(i, 3), r.text(i, 4) == "t", r.i64(i, 5)});
    return out;
}

namespace {
//! A change's result: `exists` on a unique violation, `missing` on a foreign key one or when no
//! row matched.
AdminResult admin_result(const Res & r, bool needs_row) {
    if (r.ok()) return needs_row && r.affected() == 0 ? AdminResult::missing : AdminResult::ok;
    const char * state = r.r ? PQresultErrorField(r.r, PG_DIAG_SQLSTATE) : nullptr;
    if (state && std::string(state) == "23505") return AdminResult::exists;
    if (state && std::string(state) == "23503") return AdminResult::missing;
    return AdminResult::unavailable;
}
}  // namespace

AdminResult PostgresStore::create_tenant(const TenantRecord & t) {
    auto l = acquire(*shards_[0]);
    if (!l) return AdminResult::unavailable;
    return admin_result(
        l.query("INSERT INTO tenants VALUES ($1,$2,$3,$4,$5,$6,$7)",
                {t.name, std::to_string(t.rpm), std::to_string(t.tpm), std::to_string(t.live_sessions),
                 std::to_string(t.kv_bytes), std::to_string(t.created_ms), std::to_string(t.updated_ms)}),
        false);
}

AdminResult PostgresStore::update_tenant(const TenantRecord & t) {
    auto l = acquire(*shards_[0]);
    if (!l) return AdminResult::unavailable;
    return admin_result(
        l.query("UPDATE tenants SET rpm=$2, tpm=$3, live_sessions=$4, kv_bytes=$5, updated_ms=$6 WHERE name=$1",
                {t.name, std::to_string(t.rpm), std::to_string(t.tpm), std::to_string(t.live_sessions),
                 std::to_string(t.kv_bytes), std::to_string(t.updated_ms)}),
        true);
}

AdminResult PostgresStore::delete_tenant(const std::string & name) {
    auto l = acquire(*shards_[0]);
    if (!l) return AdminResult::unavailable;
    return admin_result(l.query("DELETE FROM tenants WHERE name=$1", {name}), true);
}

AdminResult PostgresStore::create_key(const KeyRecord & k) {
    auto l = acquire(*shards_[0]);
    if (!l) return AdminResult::unavailable;
    return admin_result(
        l.query("INSERT INTO api_keys VALUES ($1,$2,$3,$4,$5,$6)",
                {k.id, k.hash, k.tenant, k.prefix, k.admin ? "true" : "false", std::to_string(k.created_ms)}),
        false);
}

AdminResult PostgresStore::delete_key(const std::string & id) {
    auto l = acquire(*shards_[0]);
    if (!l) return AdminResult::unavailable;
    return admin_result(l.query("DELETE FROM api_keys WHERE id=$1", {id}), true);
}

std::vector<std::string> PostgresStore::expired(const std::vector<std::string> & states, int64_t before_ms,
                                                size_t limit) {
    if (states.empty() || limit == 0) return {};
    const std::string sql = "SELECT id FROM sessions WHERE state IN (" + in_list(states.size(), 1) +
                            ") AND updated_ms < $" + std::to_string(states.size() + 1) + " LIMIT $" +
                            std::to_string(states.size() + 2);
    std::vector<std::string> params = states;
    params.push_back(std::to_string(before_ms));
    params.push_back(std::to_string(limit));
    std::vector<std::string> out;
    for (auto & sh : shards_) {
        if (out.size() >= limit) break;
        auto l = acquire(*sh);
        if (!l) continue;
        Res r = l.query(sql, params);
        for (int i = 0; r.ok() && i < r.rows() && out.size() < limit; ++i)
            out.push_back(r.text(i, 0));
    }
    return out;
}

std::vector<std::string> PostgresStore::expired_responses(int64_t before_ms, size_t limit) {
    std::vector<std::string> out;
    for (auto & sh : shards_) {
        if (out.size() >= limit) break;
        auto l = acquire(*sh);
        if (!l) continue;
        Res r = l.query("SELECT id FROM responses WHERE created_ms < $1 LIMIT $2",
                        {std::to_string(before_ms), std::to_string(limit)});
        for (int i = 0; r.ok() && i < r.rows() && out.size() < limit; ++i)
            out.push_back(r.text(i, 0));
    }
    return out;
}

std::vector<Store::MinuteCount> PostgresStore::count_since(const std::vector<std::string> & states, int64_t since_ms) {
    if (states.empty()) return {};
    const std::string sql = "SELECT state, updated_ms / 60000, count(*) FROM sessions WHERE state IN (" +
                            in_list(states.size(), 1) + ") AND updated_ms >= $" + std::to_string(states.size() + 1) +
                            " AND agent_id NOT LIKE '@%' GROUP BY state, updated_ms / 60000";
    std::vector<std::string> params = states;
    params.push_back(std::to_string(since_ms));
    std::map<std::pair<std::string, int64_t>, int64_t> sum;
    for (auto & sh : shards_) {
        auto l = acquire(*sh);
        if (!l) continue;
        Res r = l.query(sql, params);
        for (int i = 0; r.ok() && i < r.rows(); ++i)
            sum[{r.text(i, 0), r.i64(i, 1)}] += r.i64(i, 2);
    }
    std::vector<MinuteCount> out;
    for (const auto & [k, n] : sum)
        out.push_back({k.first, k.second, n});
    return out;
}

std::string PostgresStore::ended_since_sql(bool by_cell) {
    // The state predicate is the `sessions_ended` index's, literally, so that the planner can use
    // it: one cell's window of ended rows, not every cell's.
    return "SELECT cell, state, reason LIKE 'deadline%', epoch > 1, count(*) FROM sessions "
           "WHERE state IN ('completed','failed','cancelled') AND updated_ms >= $1 AND agent_id NOT LIKE '@%'" +
           std::string(by_cell ? " AND cell = $2" : "") + " GROUP BY 1, 2, 3, 4";
}

std::optional<std::vector<Store::EndedCount>> PostgresStore::ended_since(const std::string & cell, int64_t since_ms) {
    const std::string sql = ended_since_sql(!cell.empty());
    std::vector<std::string> params{std::to_string(since_ms)};
    if (!cell.empty()) params.push_back(cell);
    std::map<std::tuple<std::string, std::string, bool, bool>, int64_t> sum;
    const bool all = on_every_shard(sql, params, [&](const Res & r) {
        for (int i = 0; i < r.rows(); ++i)
            sum[{r.text(i, 0), r.text(i, 1), r.text(i, 2) == "t", r.text(i, 3) == "t"}] += r.i64(i, 4);
    });
    if (!all) return std::nullopt;
    std::vector<EndedCount> out;
    for (const auto & [k, n] : sum)
        out.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), n});
    return out;
}

Status PostgresStore::writable() {
    for (auto & sh : shards_) {
        std::lock_guard lk(sh->mu);
        if (!sh->sticky.empty()) return Status::Error("store failed: " + sh->sticky);
    }
    return Status::Ok();
}

Status PostgresStore::recover() {
    for (auto & sh : shards_) {
        std::lock_guard wl(sh->wmu);
        if (PQstatus(sh->wconn) != CONNECTION_OK) PQreset(sh->wconn);
        Res r = run(sh->wconn, "SELECT 1", {}, sh->query_timeout_ms);  // cheap: every waiting session may ask
        if (!r.ok())
            return Status::Error("PostgreSQL shard " + std::to_string(sh->index) + ": " + error_of(sh->wconn, r));
    }
    for (auto & sh : shards_) {
        std::lock_guard lk(sh->mu);
        sh->sticky.clear();
    }
    return Status::Ok();
}

}  // namespace armada::store

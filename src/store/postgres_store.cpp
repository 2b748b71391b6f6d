#include "store/postgres_store.h"

#include "store/pg_conn.h"
#include "store/pg_schema.h"
#include "store/postgres_shard.h"

#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <set>
#include <thread>
#include <tuple>

namespace armada::store {

using pg::error_of;
using pg::Res;
using pg::run;
using pg::trim;

namespace {

constexpr const char * kSessionColumns = "id,agent_id,owner,state,reason,data,created_ms,updated_ms,node,epoch,cell";

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

}  // namespace

int PostgresStore::schema_version() {
    return pg::latest_schema();
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
        const std::string where = "PostgreSQL " + pg::redact(sh->url);
        sh->wconn = pg::connect(sh->url, cfg.connect_timeout_s, cfg.statement_timeout_ms);
        if (PQstatus(sh->wconn) != CONNECTION_OK) {
            error = "cannot connect to " + where + ": " + trim(PQerrorMessage(sh->wconn));
            return nullptr;
        }
        if (auto e = pg::migrate(sh->wconn); !e.empty()) {
            error = where + ": " + e;
            return nullptr;
        }
        // The read pool is opened and checked now, not at the first request under load.
        for (int k = 0; k < cfg.read_connections; ++k) {
            PGconn * c = pg::connect(sh->url, cfg.connect_timeout_s, cfg.statement_timeout_ms);
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

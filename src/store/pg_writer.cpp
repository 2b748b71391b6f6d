// PostgresStore's writer: batches queued per shard, grouped into one transaction, each batch's
// fences checked by the statements that write it.
#include "store/pg_conn.h"
#include "store/postgres_shard.h"
#include "store/postgres_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>

namespace armada::store {

using pg::error_of;
using pg::Res;
using pg::run;
using pg::trim;

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

}  // namespace armada::store

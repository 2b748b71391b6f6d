#include "cluster/runtime/elected.h"
#include "common/backoff.h"

#include "cluster/runtime/clock.h"
#include "cluster/runtime/election.h"

#include "cluster/cluster_config.h"
#include "obs/log.h"
#include "obs/trace.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>

namespace armada::cluster {

int64_t brain_now_ms() {
    return real_clock().now_ms();
}

const std::vector<std::string> kEndedStates = {"completed", "failed", "cancelled"};

std::vector<store::Status> commit_each(store::Store & st, std::vector<store::Batch> batches) {
    std::vector<store::Status> out(batches.size());
    if (batches.empty()) return out;
    if (!st.writable().ok) st.recover();  // PostgreSQL came back
    std::mutex mu;
    std::condition_variable cv;
    size_t left = batches.size();
    for (size_t i = 0; i < batches.size(); ++i) {
        st.commit(std::move(batches[i]), [&, i](store::Status s) {
            std::lock_guard lk(mu);
            out[i] = std::move(s);
            if (--left == 0) cv.notify_all();
        });
    }
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return left == 0; });
    return out;
}

bool etcd_metrics(obs::Registry & m, KvStore & etcd) {
    EtcdStatus st;
    bool alarms_known = false;
    if (!etcd.status(st, alarms_known).empty()) return false;
    m.gauge("armada_etcd_db_bytes", "Size of etcd's backend file (its quota counts this)").set(double(st.db_bytes));
    m.gauge("armada_etcd_db_in_use_bytes", "Bytes of etcd's backend in use after compaction")
        .set(double(st.db_in_use_bytes));
    m.gauge("armada_etcd_revision", "etcd's current revision").set(double(st.revision));
    m.gauge("armada_etcd_alarms_readable", "1 when etcd's alarm list could be read (it needs the root role)")
        .set(alarms_known ? 1 : 0);
    if (alarms_known) {
        for (const char * kind : {"NOSPACE", "CORRUPT"}) {
            const bool on = std::find(st.alarms.begin(), st.alarms.end(), kind) != st.alarms.end();
            m.gauge("armada_etcd_alarm", "1 while etcd raises this alarm (NOSPACE: it refuses every write)",
                    {{"alarm", kind}})
                .set(on ? 1 : 0);
        }
    }
    return true;
}

store::Status mark_leader(store::Store & st, const std::string & election, int64_t rev) {
    store::Batch b;
    b.probe = true;  // a part for every shard
    b.leader = {election, rev};
    return commit_each(st, {std::move(b)}).at(0);
}

bool newer_leader_wrote(const store::Status & s) {
    return s.deposed;
}

void survival_metrics(obs::Registry & m, const std::map<std::string, Survival> & by_cell, bool cluster) {
    const auto put = [&](const std::string & prefix, const Survival & s, const obs::Labels & where) {
        m.gauge(prefix + "_chain_survival_ratio",
                "Share of agent sessions ended in the last hour that completed; client cancels excluded", where)
            .set(s.ratio());
        const std::pair<const char *, int64_t> outcomes[] = {{"completed", s.completed},
                                                             {"failed", s.failed},
                                                             {"timed_out", s.timed_out},
                                                             {"lost", s.lost},
                                                             {"cancelled", s.cancelled}};
        for (const auto & [outcome, n] : outcomes) {
            obs::Labels l = where;
            l.emplace_back("outcome", outcome);
            m.gauge(prefix + "_sessions_ended", "Agent sessions that ended in the last hour, by outcome", l)
                .set(double(n));
        }
    };
    for (const auto & [cell, s] : by_cell) {
        if (cell.empty()) {
            if (cluster) put("armada_cluster", s, {});
        } else {
            put("armada_cell", s, {{"cell", cell}});
        }
    }
}

void cell_metrics(obs::Registry & m, const CellReport & r) {
    const obs::Labels l{{"cell", r.cell}};
    m.gauge("armada_cell_nodes", "Live nodes of the cell", l).set(r.nodes);
    m.gauge("armada_cell_live_sessions", "Sessions the cell's nodes run", l).set(r.live_sessions);
    m.gauge("armada_cell_queued_sessions", "Open sessions waiting for room on a node", l).set(r.queued);
    m.gauge("armada_cell_free_sequences", "Session slots free on the cell's nodes that take work", l).set(r.free_seqs);
    m.gauge("armada_cell_kv_headroom_bytes", "KV budget left on the cell's nodes that take work", l)
        .set(double(r.kv_headroom));
    m.gauge("armada_cell_kv_watermark_ratio", "Share of the cell's KV budget in use (NaN: not reported)", l)
        .set(r.kv_budget > 0 ? 1.0 - double(r.kv_headroom) / double(r.kv_budget) : std::nan(""));
    m.gauge("armada_cell_step_latency_seconds", "Recent model-step latency on the cell's nodes", l)
        .set(r.step_ms / 1000.0);
}

Elected::Elected(KvStore & kv, int ttl_s, std::string what, WaitStop wait_stop)
    : kv_(kv), ttl_s_(ttl_s), what_(std::move(what)), wait_stop_(std::move(wait_stop)) {
    trace_counts_ = obs::tracer()->count_in(metrics_);
}

Elected::~Elected() {
    quit_ = true;
    if (keepalive_.joinable()) keepalive_.join();
    if (observer_.joinable()) observer_.join();
}

bool Elected::wait_signal(int ms) {
    if (quit_.load()) return true;
    // A loop that waits on purpose is not stuck: it beats between slices of the wait.
    do {
        const int slice = std::min(ms, 250);
        if (wait_stop_(slice)) quit_ = true;
        ms -= slice;
        if (leading_.load()) beat();
    } while (ms > 0 && !quit_.load());
    return quit_.load();
}

void Elected::beat() {
    beat_ms_ = brain_now_ms();
}

int stall_limit_ms(int ttl_s) {
    return int(stall_limit_of(int64_t(ttl_s) * 1000));
}

void brain_store_limits(int ttl_s, int & statement_timeout_ms, int & client_grace_ms) {
    const int limit = stall_limit_ms(ttl_s);
    statement_timeout_ms = std::max(250, limit / 2);
    client_grace_ms = std::max(100, limit / 4);
}

void Elected::keep_lease() {
    const int64_t ttl_ms = int64_t(ttl_s_) * 1000;
    // Looks often enough that a stall is caught soon after the limit, not a renewal later.
    const auto slice = std::chrono::milliseconds(std::max<int64_t>(20, renew_every_ms(ttl_ms) / 5));
    int64_t held = 0, renewed = 0;  // the lease looked after, and when it was last renewed
    while (!quit_.load()) {
        std::this_thread::sleep_for(slice);
        const int64_t l = lease_.load();
        if (l == 0) continue;
        if (l != held) {  // granted just now
            held = l;
            renewed = renewed_ms_.load();  // run() set it when it asked for the grant
        }
        // leading_ first: run() beats before it sets it, so a fresh leadership reads a fresh beat.
        const bool leading = leading_.load();
        const int64_t now = brain_now_ms();
        switch (lease_step(now, renewed, beat_ms_.load(), leading, ttl_ms)) {
            case LeaseStep::Wait:
                break;
            case LeaseStep::GiveUp: {
                // Giving the lease up deletes the leader's key at once: a standby wins now rather
                // than a TTL after the last renewal.
                spdlog::error("{}: the leader's loop has not moved for {} ms (a call that hangs?); giving up the lead",
                              what_, now - beat_ms_.load());
                ++stalls_;
                metrics_
                    .counter("armada_brain_stalls_total",
                             "Leaderships this brain gave up because its loop stopped moving for most of a lease TTL")
                    .inc();
                int64_t expect = l;
                if (lease_.compare_exchange_strong(expect, 0)) {
                    if (auto e = kv_.lease_revoke(l); !e.empty()) spdlog::warn("{}: revoking the lease: {}", what_, e);
                }
                break;
            }
            case LeaseStep::Lost: {
                // No renewal got through for a whole TTL: etcd may have ended the lease, and a
                // standby may lead. Whatever the store says later, this process stops leading now.
                spdlog::warn("{}: the brain's lease was not renewed for {} ms; taking a new one", what_, now - renewed);
                int64_t expect = l;
                lease_.compare_exchange_strong(expect, 0);
                break;
            }
            case LeaseStep::Renew: {
                bool alive = false;
                if (const std::string e = kv_.lease_keepalive(l, alive); !e.empty()) {
                    spdlog::warn("{}: lease keep-alive: {}", what_, e);  // again at the next look
                } else if (!alive) {
                    spdlog::warn("{}: the brain's lease expired", what_);
                    int64_t expect = l;
                    lease_.compare_exchange_strong(expect, 0);
                } else {
                    renewed = now;
                    renewed_ms_ = renewed;
                }
                break;
            }
        }
    }
}

void Elected::observe(const std::string & election) {
    ElectionView view(kv_, election);
    while (!quit_.load()) {
        std::string e;
        if (view.refresh(250, e)) {
            const auto l = view.leader();
            std::lock_guard lk(seen_mu_);
            observing_ = true;
            const std::string key = l ? l->key : std::string();
            if (key != seen_key_ && !key.empty()) {
                spdlog::debug("{}: {} leads", what_, l->value);
                metrics_
                    .counter("armada_brain_leader_changes_total",
                             "Leaders this brain has seen take over its election (itself included)")
                    .inc();
            }
            seen_key_ = key;
            continue;
        }
        {
            std::lock_guard lk(seen_mu_);
            observing_ = false;
        }
        spdlog::debug("{}: following the election: {}", what_, e);
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(common::jittered_ms(1000));
        while (!quit_.load() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

std::string Elected::campaign(const std::string & election, const std::string & name, EtcdLeader & me) {
    // Stands under the lease held now, then waits until its key is the oldest. Gives up (to stand
    // again) on a stop, when the lease it stands under went (its key went with it), or after a
    // while; stop signals are taken throughout.
    const int64_t lease = lease_.load();
    if (lease == 0) return "not elected yet";  // the keep-alive dropped it just now: take a new one
    if (auto e = stand(kv_, election, name, lease, me); !e.empty()) return e;
    ElectionView view(kv_, election);
    const int64_t until = brain_now_ms() + kCampaignMs;
    while (brain_now_ms() < until) {
        if (wait_signal(0) || lease_.load() != lease) break;
        std::string e;
        if (!view.refresh(100, e)) {
            if (wait_signal(common::jittered_ms(500))) break;
            continue;
        }
        if (const auto l = view.leader(); l && l->key == me.key) return {};
        if (!view.holds(me.key)) break;  // its key went (a restore) while its lease lives: stand again
    }
    return "not elected yet";
}

bool Elected::claim_store(store::Store & st, const std::string & election, const EtcdLeader & me) {
    int pause_ms = 250;
    for (;;) {
        const store::Status s = mark_leader(st, election, me.rev);
        if (s.ok) return true;
        if (s.fenced)
            spdlog::error("{}: cannot lead: {}", what_, s.error);
        else
            spdlog::warn("{}: the store does not take this leader's mark yet: {}; retrying", what_, s.error);
        if (wait_signal(common::jittered_ms(pause_ms)) || !still_leader(me, election)) return false;
        beat();
        pause_ms = std::min(pause_ms * 2, 5000);
    }
}

bool Elected::still_leader(const EtcdLeader & me, const std::string & election) {
    if (me.lease == 0 || lease_.load() != me.lease) return false;
    // A renewal that has not got through for a TTL (the keep-alive may be blocked in the call):
    // etcd may have ended the lease already.
    if (brain_now_ms() - renewed_ms_.load() >= int64_t(ttl_s_) * 1000) return false;
    {
        std::lock_guard lk(seen_mu_);
        if (observing_ && seen_key_ == me.key) return true;
    }
    // The follower is away, late, or has seen someone else: the store says.
    EtcdLeader now;
    if (!election_leader(kv_, election, now).empty()) return false;
    return now.key == me.key;
}

void Elected::run(const std::string & election, const std::string & name,
                  const std::function<void(const EtcdLeader &)> & lead) {
    metrics_.gauge("armada_brain_leading", "1 while this brain leads its election").set(0);
    // Which election this brain stands in, for rules that ask whether each one has a leader.
    metrics_.gauge("armada_brain_info", "1, labelled with the election this brain stands in", {{"election", election}})
        .set(1);
    metrics_.gauge("armada_brain_epoch", "The etcd revision this brain leads under (its fencing epoch; 0: not leading)")
        .set(0);
    keepalive_ = std::thread([this] { keep_lease(); });
    observer_ = std::thread([this, election] { observe(election); });
    auto jitter = [] { return common::jittered_ms(1000); };
    while (!stopping()) {
        if (lease_.load() == 0) {
            int64_t l = 0;
            const int64_t asked = brain_now_ms();  // etcd keeps the lease at least a TTL from here
            if (auto e = kv_.lease_grant(int64_t(ttl_s_) * 1000, l); !e.empty()) {
                spdlog::warn("{}: no lease from etcd: {}; retrying", what_, e);
                if (wait_signal(jitter())) break;
                continue;
            }
            renewed_ms_ = asked;  // before lease_: still_leader and the keep-alive read both
            lease_ = l;
        }
        EtcdLeader me;
        const std::string e = campaign(election, name, me);
        if (e == "not elected yet") continue;  // a stop, a lost lease, or a long wait: stand again
        if (!e.empty()) {
            spdlog::warn("{}: campaign: {}", what_, e);
            if (wait_signal(jitter())) break;
            continue;
        }
        if (!still_leader(me, election)) continue;
        spdlog::info("{}: {} leads (epoch {})", what_, name, me.rev);
        auto & leading = metrics_.gauge("armada_brain_leading", "");
        auto & epoch = metrics_.gauge("armada_brain_epoch", "");
        leading.set(1);
        epoch.set(double(me.rev));
        beat();
        leading_ = true;
        lead(me);
        leading_ = false;
        leading.set(0);
        epoch.set(0);
        if (stopping()) {
            if (auto r = resign(kv_, me); r.empty())
                spdlog::info("{}: {} resigned", what_, name);
            else
                spdlog::warn("{}: resign: {}", what_, r);
        } else {
            spdlog::warn("{}: {} no longer leads; campaigning again", what_, name);
        }
    }
    quit_ = true;
    if (keepalive_.joinable()) keepalive_.join();
    if (observer_.joinable()) observer_.join();
    if (const int64_t l = lease_.exchange(0); l != 0) kv_.lease_revoke(l);  // its candidacy goes too
}

}  // namespace armada::cluster

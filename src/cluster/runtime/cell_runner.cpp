#include "cluster/runtime/cell_runner.h"

#include "cluster/membership.h"
#include "cluster/queue.h"
#include "cluster/runtime/elected.h"
#include "common/backoff.h"
#include "common/json_fields.h"
#include "obs/log.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

namespace armada::cluster {

namespace {

using json = nlohmann::json;
constexpr size_t kMaxTraced = 65536;  // place requests' trace contexts kept (bounded; only spans are lost)

}  // namespace

CellRunner::CellRunner(CellRunnerConfig cfg, KvStore & kv, Bus & bus, Inbox & places, Inbox & events,
                       store::Store & store, Clock & clock, obs::Registry & metrics)
    : cfg_(std::move(cfg)),
      keys_(cfg_.prefix),
      kv_(kv),
      bus_(bus),
      places_(places),
      events_(events),
      store_(store),
      clock_(clock),
      metrics_(metrics) {}

CellRunner::~CellRunner() = default;

void CellRunner::lead(Leadership & term) {
    if (!begin(term)) return;
    while (turn(term)) {
        if (term.wait_stop(0)) break;
    }
    end();
}

bool CellRunner::begin(Leadership & term) {
    // Every write under this leadership: one from a brain that was deposed while it paused is
    // refused once this one has written.
    leader_ = {keys_.cell_election(cfg_.cell), term.me().rev};
    if (!term.claim_store(store_)) return false;
    // The cell's recent failovers, as the leaders before this one saw them.
    failovers_.clear();
    failovers_read_ = read_failovers();
    brain_ = std::make_unique<CellBrain>();
    // The node list watched between reconciles (each reconcile also reads it afresh).
    nodes_ = std::make_unique<Informer>(kv_, keys_.nodes(cfg_.cell), clock_, 0,
                                        common::Backoff(250, 4000, cfg_.seed ? cfg_.seed : std::random_device{}()));
    nodes_ok_ = false;
    traces_.clear();
    last_reconcile_ = -1;
    retry_at_ = 0;
    last_check_ = clock_.now_ms();
    backoff_.reset();
    return true;
}

void CellRunner::end() {
    nodes_.reset();
    brain_.reset();
    // Only the leader speaks for the cell: a standby exports none of its figures.
    metrics_.erase_families("armada_cell_");
    survival_at_ = 0;
    ended_.clear();
}

bool CellRunner::turn(Leadership & term) {
    term.beat();  // the loop moves: a stall past most of a lease TTL gives the lead up
    const int64_t t = clock_.now_ms();
    const bool reconcile_due =
        (last_reconcile_ < 0 && t >= retry_at_) || (last_reconcile_ >= 0 && t - last_reconcile_ >= cfg_.reconcile_ms);
    // The node list: what changed since the last turn (a re-list hands out the difference). A
    // node whose lease went leaves the view here.
    {
        std::vector<EtcdEvent> changes;
        std::string err;
        const bool ok = nodes_->poll(changes, 0, err);
        if (!ok && nodes_ok_) spdlog::warn("cell {}: {}", cfg_.cell, err);
        nodes_ok_ = ok;
        apply_node_changes(changes, t);
    }
    if (reconcile_due) {
        const bool ok = reconcile();
        ++reconciles_;
        metrics_
            .counter("armada_brain_reconciles_total", "Views rebuilt from etcd and PostgreSQL",
                     {{"outcome", ok ? "ok" : "failed"}})
            .inc();
        if (ok) {
            last_reconcile_ = t;
            backoff_.reset();
        } else {
            // etcd or PostgreSQL is away: the next try waits a jittered pause that doubles.
            ++reconcile_failures_;
            last_reconcile_ = -1;
            retry_at_ = t + backoff_.next_ms();
        }
    }
    term.beat();
    if (!take_places(term)) return false;
    if (!place(term)) return false;
    if (t - last_check_ >= cfg_.check_ms) {
        last_check_ = t;
        if (!term.still_leader()) return false;
        if (!failovers_read_) failovers_read_ = read_failovers();
        keep_failovers(term.me());
        report(term, t);
    }
    return true;
}

bool CellRunner::reconcile() {
    // The live nodes, read afresh (a watch over a connection that died without a word would keep
    // an old view). When etcd cannot be read, the view as last listed and watched: an etcd that
    // cannot be read is not every node gone. Nothing before a first view.
    std::vector<EtcdKv> listed;
    int64_t rev = 0;
    std::vector<const EtcdKv *> kvs;
    if (auto e = kv_.list(keys_.nodes(cfg_.cell), listed, rev); e.empty()) {
        for (const auto & kv : listed)
            kvs.push_back(&kv);
    } else if (nodes_->synced()) {
        for (const auto & [key, kv] : nodes_->view())
            kvs.push_back(&kv);
    } else {
        spdlog::warn("cell {}: cannot read the cell's nodes: {}; the view is kept", cfg_.cell, e);
        return false;
    }
    std::set<std::string> live;
    std::vector<NodeLoad> loads;
    for (const EtcdKv * kv : kvs) {
        const auto k = keys_.parse(kv->key);
        if (k.kind != ClusterKeys::Parsed::Kind::Node || k.cell != cfg_.cell) continue;
        live.insert(k.name);
        if (auto l = decode_load(k.name, kv->value)) loads.push_back(*l);
    }
    const auto rows = store_.open_sessions(cfg_.cell, "", kEndedStates);
    if (!rows) {
        // Not "no session is open": the brain keeps the view it has until a read succeeds.
        spdlog::warn("cell {}: cannot read the cell's open sessions from the store; the view is kept", cfg_.cell);
        return false;
    }
    std::vector<CellBrain::OpenSession> open;
    std::map<std::string, int> by_tenant;
    std::unordered_map<std::string, obs::TraceContext> traced;
    for (const auto & r : *rows) {
        open.push_back({r.id, r.node, r.epoch});
        ++by_tenant[r.owner];
        // Its row says which trace it is in once it has taken a turn; before, the `place` this
        // brain gave it does (kept from before this reconcile).
        if (auto tc = obs::TraceContext::in_record(r.data))
            traced.emplace(r.id, std::move(*tc));
        else if (auto old = session_traces_.find(r.id); old != session_traces_.end())
            traced.emplace(r.id, old->second);
    }
    by_tenant_ = std::move(by_tenant);
    session_traces_ = std::move(traced);
    for (const auto & name : brain_->live_nodes()) {
        if (!live.count(name)) node_left(name);
    }
    brain_->reconcile(live, open);
    const int64_t t = clock_.now_ms();
    for (const auto & l : loads)
        brain_->load(l, t);
    return true;
}

void CellRunner::apply_node_changes(const std::vector<EtcdEvent> & changes, int64_t now) {
    for (const auto & ev : changes) {
        const auto k = keys_.parse(ev.kv.key);
        if (k.kind != ClusterKeys::Parsed::Kind::Node || k.cell != cfg_.cell) continue;
        if (ev.type == EtcdEvent::Type::Delete) {
            if (brain_->live(k.name)) node_left(k.name);
            brain_->node_down(k.name);
        } else {
            if (!brain_->live(k.name)) spdlog::info("cell {}: node {} joined", cfg_.cell, k.name);
            brain_->node_up(k.name);
            if (auto l = decode_load(k.name, ev.kv.value)) brain_->load(*l, now);
        }
    }
}

void CellRunner::node_left(const std::string & name) {
    const int n = brain_->sessions_on(name);
    spdlog::warn("cell {}: node {} left (its lease is gone); {} sessions to move", cfg_.cell, name, n);
    if (n == 0) return;
    failovers_.push_back({clock_.wall_ms(), name, n});
    if (failovers_.size() > CellReport::kMaxFailovers) failovers_.erase(failovers_.begin());
    failovers_dirty_ = true;  // kept in etcd with the next report, off the failover's path
}

bool CellRunner::read_failovers() {
    std::optional<EtcdKv> kept;
    if (auto e = kv_.get(keys_.cell_failovers(cfg_.cell), kept); !e.empty()) {
        spdlog::warn("cell {}: cannot read its recent failovers: {}", cfg_.cell, e);
        return false;
    }
    if (kept) {
        if (auto r = decode_cell_report(cfg_.cell, kept->value)) {
            std::vector<CellReport::Failover> all = r->failovers;
            all.insert(all.end(), failovers_.begin(), failovers_.end());
            if (all.size() > CellReport::kMaxFailovers) all.erase(all.begin(), all.end() - CellReport::kMaxFailovers);
            failovers_ = std::move(all);
        }
    }
    return true;
}

void CellRunner::keep_failovers(const EtcdLeader & me) {
    // Only while `me` leads, and only once they were read at takeover, so a write never drops
    // what the leaders before saw.
    if (!failovers_dirty_ || !failovers_read_) return;
    CellReport kept;
    kept.cell = cfg_.cell;
    kept.failovers = failovers_;
    bool ok = false;
    int64_t rev = 0;
    const std::vector<EtcdCompare> fence{{EtcdCompare::Target::Create, me.key, me.rev}};
    if (auto e = kv_.txn(fence, {{keys_.cell_failovers(cfg_.cell), encode_cell_report(kept)}}, ok, rev); !e.empty())
        spdlog::warn("cell {}: cannot keep its failovers in etcd: {}", cfg_.cell, e);
    else
        failovers_dirty_ = false;  // written, or refused: another brain leads now
}

void CellRunner::report(Leadership & term, int64_t now) {
    // By both paths: in etcd under this brain's lease (it goes when no brain of the cell leads any
    // more), and on the bus (pushed to every global brain as it is made; nothing is kept).
    CellReport r = cell_report(cfg_.cell, brain_->loads(now), by_tenant_, int(brain_->queued()));
    r.leader = term.me().value;
    cell_metrics(metrics_, r);
    const int64_t wall = clock_.wall_ms();
    if (wall - survival_at_ >= 5000) {
        // The cell's chain survival, from the rows themselves: a new leader has it at once. A
        // shard that cannot be read leaves the last figures as they were.
        survival_at_ = wall;
        if (auto rows = store_.ended_since(cfg_.cell, wall - kSurvivalWindowMs)) {
            auto by = survival_by_cell(*rows);
            const Survival & s = by[cfg_.cell];  // none ended in the window: zeros, and no ratio
            survival_metrics(metrics_, by, false);
            ended_ = {{"completed", s.completed},
                      {"failed", s.failed},
                      {"timed_out", s.timed_out},
                      {"lost", s.lost},
                      {"cancelled", s.cancelled}};
        }
    }
    r.ended = ended_;
    r.failovers = failovers_;
    const std::string encoded = encode_cell_report(r);
    if (auto e = kv_.put(keys_.cell_report(cfg_.cell), encoded, term.lease()); !e.empty())
        spdlog::warn("cell {}: cannot write its report: {}", cfg_.cell, e);
    if (auto e = bus_.publish_now(report_subject(cfg_.cell), encoded); !e.empty())
        spdlog::debug("cell {}: report not sent on NATS: {}", cfg_.cell, e);
}

void CellRunner::take_events() {
    // A session that ended leaves the view now (were its node to die before the next reconcile,
    // it is not moved); a node that drains gets nothing more.
    std::string err;
    for (auto & m : events_.fetch(256, 1, err)) {
        const json j = json::parse(m.data, nullptr, false);
        const auto str = [&](const char * k) { return common::string_field(j, k).value_or(""); };
        const std::string op = str("op"), node = str("node"), session = str("session");
        const auto epoch = common::int_field(j, "epoch");
        if (op == "ended" && !session.empty()) {
            if (brain_->node_of(session) == node) brain_->session_closed(session);
        } else if (op == "movable" && !session.empty() && !node.empty() && epoch) {
            if (const std::string tp = str("traceparent"); !tp.empty())
                if (auto tc = obs::TraceContext::parse(tp)) session_traces_[session] = std::move(*tc);
            if (auto kv = common::uint_field(j, "kv_bytes")) session_kv_bytes_[session] = {node, *kv};
            brain_->session_movable(session, node, *epoch);
        } else if (op == "draining" && !node.empty()) {
            spdlog::info("cell {}: node {} drains; nothing more goes to it", cfg_.cell, node);
            brain_->node_draining(node);
        } else {
            spdlog::warn("cell {}: unknown event on {}: {}", cfg_.cell, m.subject, m.data.substr(0, 200));
        }
        m.ack();
    }
}

bool CellRunner::take_places(Leadership & term) {
    std::string err;
    auto msgs = places_.fetch(64, cfg_.fetch_wait_ms, err);
    std::string taken;  // the sessions, for the log
    for (auto & m : msgs) {
        const json j = json::parse(m.data, nullptr, false);
        // A re-homed session comes with the epoch the global brain gave it (no node yet).
        if (const auto session = common::string_field(j, "session")) {
            const std::string & id = *session;
            // The gateway's request span, when it traces: the parent of this `place`.
            if (const auto tp = common::string_field(j, "traceparent")) {
                if (auto tc = obs::TraceContext::parse(*tp)) {
                    if (traces_.size() >= kMaxTraced) traces_.clear();
                    traces_[id] = {*tc, obs::unix_now_ns()};
                }
            }
            brain_->session_open(id, "", common::int_field(j, "epoch").value_or(0));
            taken += " " + id;
        }
        m.ack();  // the row is durable before the message is sent: reconcile finds it anyway
    }
    if (!msgs.empty())
        spdlog::info("cell {}: {} place request(s) taken from the queue:{}", cfg_.cell, msgs.size(), taken);
    if (!err.empty()) {
        // The bus is away (libnats reconnects by itself): do not spin on the error.
        spdlog::warn("cell {}: fetching place requests: {}", cfg_.cell, err);
        if (term.wait_stop(500)) return false;
    } else {
        take_events();
    }
    return true;
}

std::vector<store::Status> CellRunner::assign(const std::vector<Place> & decisions) {
    // Each decision as its own epoch-checked batch, written in one grouped commit: a lost node's
    // sessions are reassigned with one transaction rather than one each.
    std::vector<store::Batch> batches(decisions.size());
    for (size_t i = 0; i < decisions.size(); ++i) {
        batches[i].assign.push_back({decisions[i].session, decisions[i].node, decisions[i].epoch});
        batches[i].leader = leader_;
    }
    return commit_each(store_, std::move(batches));
}

void CellRunner::count_decisions(const std::vector<Place> & decisions, const std::vector<store::Status> & results,
                                 std::chrono::steady_clock::time_point since) {
    if (decisions.empty()) return;
    for (size_t i = 0; i < decisions.size(); ++i) {
        if (results[i].ok)
            metrics_
                .counter("armada_brain_decisions_total", "Decisions written to the store, by kind",
                         {{"kind", !decisions[i].from.empty() ? "migrate"
                                   : decisions[i].moved       ? "move"
                                                              : "place"}})
                .inc();
        else
            metrics_
                .counter("armada_brain_decisions_refused_total",
                         "Decisions the store refused (an epoch or leader fence) or could not write")
                .inc();
    }
    metrics_
        .histogram("armada_brain_decision_seconds", "Time to decide one round of placements and write them",
                   obs::latency_buckets())
        .observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count());
}

bool CellRunner::place(Leadership & term) {
    const auto decided_at = std::chrono::steady_clock::now();
    const auto decisions = brain_->decide(clock_.now_ms());
    const auto results = assign(decisions);
    count_decisions(decisions, results, decided_at);
    if (std::any_of(results.begin(), results.end(), newer_leader_wrote)) {
        spdlog::warn("cell {}: a newer leader has written to the store; this brain stops leading", cfg_.cell);
        return false;
    }
    for (size_t i = 0; i < decisions.size(); ++i) {
        const Place & p = decisions[i];
        const store::Status & st = results[i];
        // A `place` span for a new session (a child of its gateway request), a `migrate` span for
        // a session moved off a node.
        std::optional<obs::TraceContext> parent;
        int64_t began_ns = 0;
        if (auto tr = traces_.find(p.session); tr != traces_.end()) {
            parent = tr->second.first;
            began_ns = tr->second.second;
            traces_.erase(tr);
        } else if (p.moved) {
            // A move continues the session's trace: under its turn on the node it leaves.
            if (auto s = session_traces_.find(p.session); s != session_traces_.end()) parent = s->second;
        }
        obs::Span span = obs::Span::start(p.moved ? "migrate" : "place", obs::SpanKind::consumer, parent);
        if (began_ns > 0) span.start_ns = began_ns;
        span.set("armada.session.id", p.session);
        span.set("gen_ai.conversation.id", p.session);
        span.set("armada.cell", cfg_.cell);
        span.set("armada.node", p.node);
        if (!p.left.empty()) span.set("armada.node.from", p.left);  // a failover's too
        span.set("armada.epoch", p.epoch);
        span.set("armada.brain.epoch", term.me().rev);
        // The lines below about this session carry it and its trace (JSON logs).
        const obs::LogScope log_scope(p.session, obs::tracer()->enabled() ? std::optional(span.context()) : parent);
        if (!st.ok) {
            if (!st.fenced) spdlog::warn("cell {}: assigning {}: {}", cfg_.cell, p.session, st.error);
            brain_->place_failed(p.session);
            span.fail(st.fenced ? "fenced" : "the assignment was not written");
            obs::tracer()->end(std::move(span));
            continue;
        }
        json run = {{"op", "run"}, {"session", p.session}, {"epoch", p.epoch}};
        if (!p.from.empty()) {
            run["from"] = p.from;  // the new node fetches its KV there, no more than it stated
            if (auto kv = session_kv_bytes_.find(p.session);
                kv != session_kv_bytes_.end() && kv->second.first == p.from)
                run["kv_bytes"] = kv->second.second;
        }
        session_kv_bytes_.erase(p.session);
        // A failover: the node it left is gone, and the new node records the move.
        if (p.from.empty() && !p.left.empty()) run["left"] = p.left;
        // Untraced here, the gateway's context still reaches the node.
        if (obs::tracer()->enabled()) {
            run["traceparent"] = span.context().traceparent();
            session_traces_[p.session] = span.context();
        } else if (parent) {
            run["traceparent"] = parent->traceparent();
            session_traces_[p.session] = *parent;
        }
        obs::tracer()->end(std::move(span));
        const std::string cmd = run.dump();
        if (auto e = bus_.publish_async(command_subject(p.node), cmd, p.session + ":" + std::to_string(p.epoch));
            !e.empty())
            spdlog::warn("cell {}: run command for {} to {}: {} (the node finds it at its next start)", cfg_.cell,
                         p.session, p.node, e);
        brain_->place_done(p.session);
        if (!p.from.empty())
            spdlog::info("cell {}: session {} moves from {} to {} with its KV (epoch {})", cfg_.cell, p.session, p.from,
                         p.node, p.epoch);
        else if (p.moved)
            spdlog::info("cell {}: session {} moved to {} (epoch {})", cfg_.cell, p.session, p.node, p.epoch);
        else
            spdlog::debug("cell {}: session {} placed on {} (epoch {})", cfg_.cell, p.session, p.node, p.epoch);
        ++placed_;
    }
    return true;
}

}  // namespace armada::cluster

#include "cli/cell.h"

#include "cli/brain_http.h"
#include "cli/stop_signals.h"

#include "agent/session_manager.h"
#include "cluster/cell_brain.h"
#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/membership.h"
#include "cluster/queue.h"
#include "cluster/runtime/elected.h"
#include "obs/log.h"
#include "obs/trace.h"
#include "store/postgres_store.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <pthread.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

namespace armada::cli {

namespace {

using json = nlohmann::json;
using namespace cluster;

//! One brain process: its lease, its campaign, and while it leads, the brain's loop.
class CellProcess {
  public:
    CellProcess(ClusterConfig cfg, CellOptions o, sigset_t stop_set)
        : cfg_(std::move(cfg)),
          o_(std::move(o)),
          etcd_(make_etcd(cfg_)),
          elected_(etcd_, cfg_.lease_ttl_s, "cell " + o_.cell, signal_waiter(stop_set)) {}

    int run() {
        store::PostgresConfig pc;
        pc.urls = cfg_.postgres;
        pc.read_connections = cfg_.pg_pool;
        std::string err;
        store_ = store::PostgresStore::open(pc, err);
        if (!store_) return fail("PostgreSQL: " + err);
        js_ = JetStream::connect(cfg_.nats, err, cfg_.nats_auth);
        if (!js_) return fail("NATS at " + cfg_.nats + ": " + err);
        // Every brain of the cell shares one durable consumer: whoever leads fetches from it.
        place_ = js_->consumer("ARMADA_PLACE", "cell-" + o_.cell, place_subject(o_.cell), 30000, 10, err);
        if (!place_) return fail("NATS consumer: " + err);
        events_ = js_->consumer("ARMADA_EVENT", "cell-" + o_.cell + "-events", event_subject(o_.cell), 30000, 10, err);
        if (!events_) return fail("NATS consumer: " + err);
        if (o_.metrics_port >= 0) {
            metrics_http_ = serve_brain_metrics(elected_.metrics(), o_.metrics_host, o_.metrics_port, err);
            if (!metrics_http_) return fail("metrics listener: " + err);
        }
        obs::announce(fmt::format("armada: cell brain {} of cell {} started", o_.name, o_.cell));
        elected_.run(brain_election(cfg_, o_.cell), o_.name, [this](const EtcdLeader & me) {
            obs::announce(fmt::format("armada: cell brain {} leads cell {}", o_.name, o_.cell));
            lead(me);
        });
        spdlog::info("cell {}: brain {} stopped", o_.cell, o_.name);
        return 0;
    }

  private:
    int fail(const std::string & e) {
        fprintf(stderr, "error: %s\n", e.c_str());
        return 1;
    }
    bool stopping() const { return elected_.stopping(); }
    bool wait_signal(int ms) { return elected_.wait_signal(ms); }
    bool still_leader(const EtcdLeader & me) { return elected_.still_leader(me, brain_election(cfg_, o_.cell)); }

    //! The brain's view rebuilt from the truth: live nodes (their keys in etcd) and the cell's
    //! open sessions (PostgreSQL). Returns the etcd revision the node list was read at.
    int64_t reconcile(CellBrain & brain) {
        std::vector<EtcdKv> kvs;
        int64_t rev = 0;
        if (auto e = etcd_.list(nodes_prefix(cfg_, o_.cell), kvs, rev); !e.empty()) {
            spdlog::warn("cell {}: cannot list nodes: {}", o_.cell, e);
            return -1;
        }
        std::set<std::string> live;
        std::vector<NodeLoad> loads;
        const std::string prefix = nodes_prefix(cfg_, o_.cell);
        for (const auto & kv : kvs) {
            const std::string name = kv.key.substr(prefix.size());
            live.insert(name);
            if (auto l = decode_load(name, kv.value)) loads.push_back(*l);
        }
        std::vector<CellBrain::OpenSession> open;
        std::map<std::string, int> by_tenant;
        std::unordered_map<std::string, obs::TraceContext> traced;
        const auto rows = store_->open_sessions(o_.cell, "", kEndedStates);
        if (!rows) {
            // Not "no session is open": the brain keeps the view it has until a read succeeds.
            spdlog::warn("cell {}: cannot read the cell's open sessions from the store; the view is kept", o_.cell);
            return -1;
        }
        for (const auto & r : *rows) {
            open.push_back({r.id, r.node, r.epoch});
            ++by_tenant[r.owner];
            // Its row says which trace it is in once it has taken a turn; before, the `place` this
            // brain gave it does (kept from before this reconcile).
            if (auto tc = agent::SessionManager::record_trace(r.data))
                traced.emplace(r.id, std::move(*tc));
            else if (auto old = session_traces_.find(r.id); old != session_traces_.end())
                traced.emplace(r.id, old->second);
        }
        by_tenant_ = std::move(by_tenant);
        session_traces_ = std::move(traced);
        // A node whose lease went may show here before its watch event does: said the same way.
        for (const auto & name : brain.live_nodes()) {
            if (!live.count(name)) node_left(brain, name);
        }
        brain.reconcile(live, open);
        const int64_t t = brain_now_ms();
        for (const auto & l : loads)
            brain.load(l, t);
        return rev;
    }

    //! A node of the view whose lease is gone: said in the log and kept among the cell's recent
    //! failovers (in its report, for the dashboard) when it held sessions.
    void node_left(const CellBrain & brain, const std::string & name) {
        const int n = brain.sessions_on(name);
        spdlog::warn("cell {}: node {} left (its lease is gone); {} sessions to move", o_.cell, name, n);
        if (n == 0) return;
        const int64_t wall =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        failovers_.push_back({wall, name, n});
        if (failovers_.size() > CellReport::kMaxFailovers) failovers_.erase(failovers_.begin());
        failovers_dirty_ = true;  // kept in etcd with the next report, off the failover's path
    }

    //! The failovers kept by the leaders before, ahead of any this one saw; false when etcd could
    //! not be read (the report loop tries again).
    bool read_failovers() {
        std::optional<EtcdKv> kept;
        if (auto e = etcd_.get(cell_failovers_key(cfg_, o_.cell), kept); !e.empty()) {
            spdlog::warn("cell {}: cannot read its recent failovers: {}", o_.cell, e);
            return false;
        }
        if (kept) {
            if (auto r = decode_cell_report(o_.cell, kept->value)) {
                std::vector<CellReport::Failover> all = r->failovers;
                all.insert(all.end(), failovers_.begin(), failovers_.end());
                if (all.size() > CellReport::kMaxFailovers)
                    all.erase(all.begin(), all.end() - CellReport::kMaxFailovers);
                failovers_ = std::move(all);
            }
        }
        return true;
    }

    //! The recent failovers, where the next leader of the cell finds them (the report goes with
    //! this leader's lease): only while `me` leads, and only once they were read at takeover, so
    //! a write never drops what the leaders before saw.
    void keep_failovers(const EtcdLeader & me) {
        if (!failovers_dirty_ || !failovers_read_) return;
        CellReport kept;
        kept.cell = o_.cell;
        kept.failovers = failovers_;
        bool ok = false;
        int64_t rev = 0;
        const std::vector<EtcdCompare> fence{{EtcdCompare::Target::Create, me.key, me.rev}};
        if (auto e = etcd_.txn(fence, {{cell_failovers_key(cfg_, o_.cell), encode_cell_report(kept)}}, ok, rev);
            !e.empty())
            spdlog::warn("cell {}: cannot keep its failovers in etcd: {}", o_.cell, e);
        else
            failovers_dirty_ = false;  // written, or refused: another brain leads now
    }

    //! The cell's aggregate for the global brains, by both paths: in etcd under this brain's
    //! lease (it goes when no brain of the cell leads any more), and on NATS (pushed to every
    //! global brain as it is made; nothing is kept).
    void report(const CellBrain & brain, int64_t now) {
        CellReport r = cell_report(o_.cell, brain.loads(now), by_tenant_, int(brain.queued()));
        cell_metrics(elected_.metrics(), r);
        const int64_t wall =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        if (wall - survival_at_ >= 5000) {
            // The cell's chain survival, from the rows themselves: a new leader has it at once.
            survival_at_ = wall;
            // A shard that cannot be read leaves the last figures as they were.
            if (auto rows = store_->ended_since(o_.cell, wall - kSurvivalWindowMs)) {
                auto by = cluster::survival_by_cell(*rows);
                const cluster::Survival & s = by[o_.cell];  // none ended in the window: zeros, and no ratio
                survival_metrics(elected_.metrics(), by, false);
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
        if (auto e = etcd_.put(cell_report_key(cfg_, o_.cell), encoded, elected_.lease()); !e.empty())
            spdlog::warn("cell {}: cannot write its report: {}", o_.cell, e);
        if (auto e = js_->publish_now(report_subject(o_.cell), encoded); !e.empty())
            spdlog::debug("cell {}: report not sent on NATS: {}", o_.cell, e);
    }

    //! Node events: a session that ended leaves the view now (were its node to die before the
    //! next reconcile, it is not moved); a node that drains gets nothing more.
    void take_events(CellBrain & brain) {
        std::string err;
        for (auto & m : events_->fetch(256, 1, err)) {
            const json j = json::parse(m.data(), nullptr, false);
            const auto str = [&](const char * k) {
                return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string();
            };
            const std::string op = str("op"), node = str("node"), session = str("session");
            if (op == "ended" && !session.empty()) {
                if (brain.node_of(session) == node) brain.session_closed(session);
            } else if (op == "movable" && !session.empty() && !node.empty() && j.contains("epoch") &&
                       j["epoch"].is_number_integer()) {
                if (const std::string tp = str("traceparent"); !tp.empty())
                    if (auto tc = obs::TraceContext::parse(tp)) session_traces_[session] = std::move(*tc);
                if (j.contains("kv_bytes") && j["kv_bytes"].is_number_unsigned())
                    session_kv_bytes_[session] = {node, j["kv_bytes"].get<uint64_t>()};
                brain.session_movable(session, node, j["epoch"].get<int64_t>());
            } else if (op == "draining" && !node.empty()) {
                spdlog::info("cell {}: node {} drains; nothing more goes to it", o_.cell, node);
                brain.node_draining(node);
            } else {
                spdlog::warn("cell {}: unknown event on {}: {}", o_.cell, m.subject(), m.data().substr(0, 200));
            }
            m.ack();
        }
    }

    //! Each decision as its own epoch-checked batch, written in one grouped commit: a lost node's
    //! sessions are reassigned with one transaction rather than one each.
    std::vector<store::Status> assign(const std::vector<Place> & decisions) {
        std::vector<store::Batch> batches(decisions.size());
        for (size_t i = 0; i < decisions.size(); ++i) {
            batches[i].assign.push_back({decisions[i].session, decisions[i].node, decisions[i].epoch});
            batches[i].leader = leader_;
        }
        return commit_each(*store_, std::move(batches));
    }

    //! Placements and moves written, refused, and how long deciding and writing them took.
    void count_decisions(const std::vector<Place> & decisions, const std::vector<store::Status> & results,
                         std::chrono::steady_clock::time_point since) {
        if (decisions.empty()) return;
        obs::Registry & m = elected_.metrics();
        for (size_t i = 0; i < decisions.size(); ++i) {
            if (results[i].ok)
                m.counter("armada_brain_decisions_total", "Decisions written to the store, by kind",
                          {{"kind", !decisions[i].from.empty() ? "migrate"
                                    : decisions[i].moved       ? "move"
                                                               : "place"}})
                    .inc();
            else
                m.counter("armada_brain_decisions_refused_total",
                          "Decisions the store refused (an epoch or leader fence) or could not write")
                    .inc();
        }
        m.histogram("armada_brain_decision_seconds", "Time to decide one round of placements and write them",
                    obs::latency_buckets())
            .observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count());
    }

    void lead(const EtcdLeader & me) {
        // Every write under this leadership: one from a brain that was deposed while it paused
        // is refused once this one has written.
        leader_ = {brain_election(cfg_, o_.cell), me.rev};
        if (!elected_.claim_store(*store_, leader_.election, me)) return;
        // The cell's recent failovers, as the leaders before this one saw them.
        failovers_.clear();
        failovers_read_ = read_failovers();
        CellBrain brain;
        // The trace context each place request came with, and when it was taken (for its span).
        constexpr size_t kMaxTraced = 65536;
        std::map<std::string, std::pair<obs::TraceContext, int64_t>> traces;
        std::mutex mu;
        std::vector<EtcdEvent> events;  // guarded by mu
        std::atomic<bool> watch_stop{false}, watch_broken{true};
        std::thread watcher;
        auto start_watch = [&](int64_t from) {
            watch_stop = true;
            if (watcher.joinable()) watcher.join();
            watch_stop = false;
            watch_broken = false;
            watcher = std::thread([&, from] {
                const std::string e = etcd_.watch(
                    nodes_prefix(cfg_, o_.cell), from,
                    [&](const std::vector<EtcdEvent> & evs, int64_t) {
                        std::lock_guard lk(mu);
                        events.insert(events.end(), evs.begin(), evs.end());
                        return !watch_stop.load();
                    },
                    watch_stop);
                if (!watch_stop.load()) spdlog::warn("cell {}: node watch ended: {}", o_.cell, e);
                watch_broken = true;
            });
        };
        int64_t last_reconcile = 0, last_check = brain_now_ms();
        // When etcd or PostgreSQL is away, the next try waits a random jitter that doubles up to
        // 4 s: brains that lost it together do not come back in step.
        int64_t retry_at = 0;
        int backoff_ms = 250;
        std::mt19937 rng(std::random_device{}());
        const std::string prefix = nodes_prefix(cfg_, o_.cell);
        while (!stopping()) {
            elected_.beat();  // the loop moves: a stall past most of a lease TTL gives the lead up
            int64_t t = brain_now_ms();
            if ((watch_broken.load() && t >= retry_at) || t - last_reconcile >= o_.reconcile_ms) {
                const int64_t rev = reconcile(brain);
                last_reconcile = t;
                elected_.metrics()
                    .counter("armada_brain_reconciles_total", "Views rebuilt from etcd and PostgreSQL",
                             {{"outcome", rev >= 0 ? "ok" : "failed"}})
                    .inc();
                if (rev >= 0) {
                    backoff_ms = 250;
                    if (watch_broken.load()) start_watch(rev + 1);
                } else {
                    retry_at = t + std::uniform_int_distribution<int>(backoff_ms / 2, backoff_ms * 3 / 2)(rng);
                    backoff_ms = std::min(backoff_ms * 2, 4000);
                }
            }
            std::vector<EtcdEvent> evs;
            {
                std::lock_guard lk(mu);
                evs.swap(events);
            }
            for (const auto & ev : evs) {
                if (ev.kv.key.rfind(prefix, 0) != 0) continue;
                const std::string name = ev.kv.key.substr(prefix.size());
                if (ev.type == EtcdEvent::Type::Delete) {
                    if (brain.live(name)) node_left(brain, name);
                    brain.node_down(name);
                } else {
                    if (!brain.live(name)) spdlog::info("cell {}: node {} joined", o_.cell, name);
                    brain.node_up(name);
                    if (auto l = decode_load(name, ev.kv.value)) brain.load(*l, t);
                }
            }
            std::string err;
            auto msgs = place_->fetch(64, 50, err);
            std::string taken;  // the sessions, for the log
            for (auto & m : msgs) {
                const json j = json::parse(m.data(), nullptr, false);
                // A re-homed session comes with the epoch the global brain gave it (no node yet).
                if (j.is_object() && j.contains("session") && j["session"].is_string()) {
                    const std::string id = j["session"].get<std::string>();
                    // The gateway's request span, when it traces: the parent of this `place`.
                    if (j.contains("traceparent") && j["traceparent"].is_string()) {
                        if (auto tc = obs::TraceContext::parse(j["traceparent"].get<std::string>())) {
                            if (traces.size() >= kMaxTraced) traces.clear();  // bounded; only spans are lost
                            traces[id] = {*tc, obs::unix_now_ns()};
                        }
                    }
                    brain.session_open(
                        id, "", j.contains("epoch") && j["epoch"].is_number_integer() ? j["epoch"].get<int64_t>() : 0);
                    taken += " " + id;
                }
                m.ack();  // the row is durable before the message is sent: reconcile finds it anyway
            }
            if (!msgs.empty())
                spdlog::info("cell {}: {} place request(s) taken from the queue:{}", o_.cell, msgs.size(), taken);
            if (!err.empty()) {
                // NATS is away (libnats reconnects by itself): do not spin on the error.
                spdlog::warn("cell {}: fetching place requests: {}", o_.cell, err);
                if (wait_signal(500)) break;
            } else {
                take_events(brain);
            }
            const auto decided_at = std::chrono::steady_clock::now();
            const auto decisions = brain.decide(brain_now_ms());
            const auto results = assign(decisions);
            count_decisions(decisions, results, decided_at);
            if (std::any_of(results.begin(), results.end(), newer_leader_wrote)) {
                spdlog::warn("cell {}: a newer leader has written to the store; this brain stops leading", o_.cell);
                break;
            }
            for (size_t i = 0; i < decisions.size(); ++i) {
                const Place & p = decisions[i];
                const store::Status & st = results[i];
                // A `place` span for a new session (a child of its gateway request), a `migrate`
                // span for a session moved off a node.
                std::optional<obs::TraceContext> parent;
                int64_t began_ns = 0;
                if (auto tr = traces.find(p.session); tr != traces.end()) {
                    parent = tr->second.first;
                    began_ns = tr->second.second;
                    traces.erase(tr);
                } else if (p.moved) {
                    // A move continues the session's trace: under its turn on the node it leaves.
                    if (auto st = session_traces_.find(p.session); st != session_traces_.end()) parent = st->second;
                }
                obs::Span span = obs::Span::start(p.moved ? "migrate" : "place", obs::SpanKind::consumer, parent);
                if (began_ns > 0) span.start_ns = began_ns;
                span.set("armada.session.id", p.session);
                span.set("gen_ai.conversation.id", p.session);
                span.set("armada.cell", o_.cell);
                span.set("armada.node", p.node);
                if (!p.left.empty()) span.set("armada.node.from", p.left);  // a failover's too
                span.set("armada.epoch", p.epoch);
                span.set("armada.brain.epoch", me.rev);
                // The lines below about this session carry it and its trace (JSON logs).
                const obs::LogScope log_scope(p.session,
                                              obs::tracer()->enabled() ? std::optional(span.context()) : parent);
                if (!st.ok) {
                    if (!st.fenced) spdlog::warn("cell {}: assigning {}: {}", o_.cell, p.session, st.error);
                    brain.place_failed(p.session);
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
                if (auto e =
                        js_->publish_async(command_subject(p.node), cmd, p.session + ":" + std::to_string(p.epoch));
                    !e.empty())
                    spdlog::warn("cell {}: run command for {} to {}: {} (the node finds it at its next start)", o_.cell,
                                 p.session, p.node, e);
                brain.place_done(p.session);
                if (!p.from.empty())
                    spdlog::info("cell {}: session {} moves from {} to {} with its KV (epoch {})", o_.cell, p.session,
                                 p.from, p.node, p.epoch);
                else if (p.moved)
                    spdlog::info("cell {}: session {} moved to {} (epoch {})", o_.cell, p.session, p.node, p.epoch);
                else
                    spdlog::debug("cell {}: session {} placed on {} (epoch {})", o_.cell, p.session, p.node, p.epoch);
                ++placed_;
            }
            if (t - last_check >= 1000) {
                last_check = t;
                if (!still_leader(me)) break;
                if (!failovers_read_) failovers_read_ = read_failovers();
                keep_failovers(me);
                report(brain, t);
            }
            if (wait_signal(0)) break;
        }
        watch_stop = true;
        if (watcher.joinable()) watcher.join();
        // Only the leader speaks for the cell: a standby exports none of its figures.
        elected_.metrics().erase_families("armada_cell_");
        survival_at_ = 0;
        ended_.clear();
    }

    ClusterConfig cfg_;
    CellOptions o_;
    EtcdClient etcd_;
    Elected elected_;
    std::shared_ptr<void> metrics_http_;  // the metrics listener, while it runs
    std::unique_ptr<store::Store> store_;
    std::unique_ptr<JetStream> js_;
    std::unique_ptr<Consumer> place_, events_;
    uint64_t placed_ = 0;
    int64_t survival_at_ = 0;               // when the survival gauges were last read from the store (wall ms)
    store::Batch::Leadership leader_;       // while it leads
    std::map<std::string, int> by_tenant_;  // open sessions per tenant, at the last reconcile
    // The trace each open session is in, from its row at the last reconcile and from its node's
    // `movable` events since: a session's `migrate` span goes in it.
    std::unordered_map<std::string, obs::TraceContext> session_traces_;
    //! What each offered session's node stated as the most its KV journal is: node, bytes.
    std::unordered_map<std::string, std::pair<std::string, uint64_t>> session_kv_bytes_;
    std::map<std::string, int64_t> ended_;  // the survival window's outcomes, as last read
    //! Nodes lost with sessions on them, latest last; kept across leaderships of this process
    //! (a new leader elsewhere starts with none).
    std::vector<CellReport::Failover> failovers_;
    bool failovers_dirty_ = false, failovers_read_ = false;
};

}  // namespace

int cell_command(const CellOptions & opt) {
    const sigset_t stop_set = block_stop_signals();
    spdlog::set_level(spdlog::level::from_str(opt.log_level));
    std::string err;
    auto cfg = load_cluster_config_for_service(opt.cluster_file, err);
    if (!cfg) {
        fprintf(stderr, "error: %s\n", err.c_str());
        return 2;
    }
    CellOptions o = opt;
    if (!valid_cell_or_node_name(o.cell)) {
        fprintf(stderr, "error: --cell '%s' must be 1..63 of A-Z a-z 0-9 . _ -\n", o.cell.c_str());
        return 2;
    }
    if (o.name.empty()) {
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        o.name = std::string(host) + "-" + std::to_string(getpid());
    }
    return CellProcess(*cfg, o, stop_set).run();
}

}  // namespace armada::cli

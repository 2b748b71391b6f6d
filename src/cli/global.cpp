#include "cli/global.h"

#include "cli/brain_http.h"
#include "cli/stop_signals.h"

#include "agent/session_manager.h"
#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/global_brain.h"
#include "cluster/kube_restarter.h"
#include "cluster/membership.h"
#include "cluster/queue.h"
#include "cluster/restarter.h"
#include "cluster/rollout.h"
#include "cluster/runtime/elected.h"
#include "obs/log.h"
#include "obs/trace.h"
#include "store/postgres_store.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

namespace armada::cli {

namespace {

using json = nlohmann::json;
using namespace cluster;

class GlobalProcess {
  public:
    GlobalProcess(ClusterConfig cfg, GlobalOptions o, sigset_t stop_set)
        : cfg_(std::move(cfg)),
          o_(std::move(o)),
          etcd_(make_etcd(cfg_)),
          elected_(etcd_, cfg_.lease_ttl_s, "global", signal_waiter(stop_set)) {
        if (o_.restarter == "cluster-up") restarter_ = std::make_unique<EtcdRestarter>(etcd_, cfg_);
        if (o_.restarter == "kubernetes") {
            KubeConfig kc;
            kc.image = o_.kube_image;
            if (auto e = kube_config_in_pod(kc); !e.empty()) {
                kube_error_ = e;
            } else {
                ledger_ = std::make_unique<EtcdLedger>(etcd_, cfg_);
                restarter_ = std::make_unique<KubeRestarter>(std::move(kc), *ledger_, [] {
                    return std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                        .count();
                });
            }
        }
    }

    int run() {
        store::PostgresConfig pc;
        pc.urls = cfg_.postgres;
        pc.read_connections = cfg_.pg_pool;
        std::string err;
        store_ = store::PostgresStore::open(pc, err);
        if (!store_) return fail("PostgreSQL: " + err);
        js_ = JetStream::connect(cfg_.nats, err, cfg_.nats_auth);
        if (!js_) return fail("NATS at " + cfg_.nats + ": " + err);
        if (o_.metrics_port >= 0) {
            metrics_http_ = serve_brain_metrics(elected_.metrics(), o_.metrics_host, o_.metrics_port, err);
            if (!metrics_http_) return fail("metrics listener: " + err);
        }
        obs::announce(fmt::format("armada: global brain {} started", o_.name));
        elected_.run(global_election(cfg_), o_.name, [this](const EtcdLeader & me) {
            obs::announce(fmt::format("armada: global brain {} leads", o_.name));
            lead(me);
        });
        spdlog::info("global: brain {} stopped", o_.name);
        return 0;
    }

  private:
    int fail(const std::string & e) {
        fprintf(stderr, "error: %s\n", e.c_str());
        return 1;
    }

    //! The cells as etcd shows them: each one's report (if its brain writes one) and whether any
    //! lease of it (brain or node) is there at all.
    struct Seen {
        std::map<std::string, CellReport> reports;
        std::map<std::string, int64_t> report_rev;  // each report's etcd mod_revision
        std::set<std::string> alive;                // cells with any key under a lease
        std::map<std::string, int> live_nodes;      // node keys (each under its node's lease) per cell
        std::vector<FleetNode> nodes;               // live nodes, as their load reports show them
    };
    bool look(Seen & out) {
        std::vector<EtcdKv> kvs;
        int64_t rev = 0;
        const std::string prefix = cells_prefix(cfg_);
        if (auto e = etcd_.list(prefix, kvs, rev); !e.empty()) {
            spdlog::warn("global: cannot list the cells: {}", e);
            return false;
        }
        for (const auto & kv : kvs) {
            const std::string rest = kv.key.substr(prefix.size());
            const size_t slash = rest.find('/');
            if (slash == std::string::npos) continue;
            const std::string cell = rest.substr(0, slash), what = rest.substr(slash + 1);
            out.alive.insert(cell);
            if (what == "report") {
                if (auto r = decode_cell_report(cell, kv.value)) {
                    out.reports[cell] = *r;
                    out.report_rev[cell] = kv.mod_revision;
                }
            } else if (what.rfind("nodes/", 0) == 0) {
                const std::string node = what.substr(6);
                out.live_nodes[cell]++;
                if (auto l = decode_load(node, kv.value))
                    out.nodes.push_back({node, cell, l->version, l->draining, l->signals});
            }
        }
        return true;
    }

    //! The cells' reports pushed on NATS since the last look, the newest per cell. A cell whose
    //! brain cannot write to etcd still reports here, and a report here is fresher than the one
    //! read back from etcd.
    std::map<std::string, CellReport> pushed() {
        std::map<std::string, CellReport> out;
        if (!reports_) return out;
        const std::string prefix = report_subject("");  // a cell's name may hold dots
        for (;;) {
            const auto msgs = reports_->take(4096, 1);
            for (const auto & [subject, data] : msgs) {
                if (subject.rfind(prefix, 0) != 0) continue;
                const std::string cell = subject.substr(prefix.size());
                if (auto r = decode_cell_report(cell, data)) out[cell] = *r;
            }
            if (msgs.size() < 4096) return out;
        }
    }

    //! Says once per cell by which paths its reports come (etcd, NATS), and again when that changes.
    void note_paths(const std::string & cell, bool etcd, bool nats) {
        const int paths = (etcd ? 1 : 0) | (nats ? 2 : 0);
        auto [it, fresh] = paths_.try_emplace(cell, -1);
        if (it->second == paths) return;
        it->second = paths;
        if (paths == 0) return;  // lost: logged as such
        spdlog::info("global: cell {} reports through {}", cell,
                     paths == 3   ? "etcd and NATS"
                     : paths == 1 ? "etcd only"
                                  : "NATS only");
    }

    //! Writes each re-home as its own epoch-checked batch (grouped into one transaction), then
    //! asks the new cell's brain to place it.
    void carry_out(GlobalBrain & brain, const std::vector<Rehome> & decisions) {
        if (decisions.empty()) return;
        const auto since = std::chrono::steady_clock::now();
        std::vector<store::Batch> batches(decisions.size());
        for (size_t i = 0; i < decisions.size(); ++i) {
            batches[i].assign.push_back({decisions[i].session, "", decisions[i].epoch, decisions[i].to});
            batches[i].leader = leader_;
        }
        const auto results = commit_each(*store_, std::move(batches));
        obs::Registry & m = elected_.metrics();
        for (const auto & r : results) {
            if (r.ok)
                m.counter("armada_brain_decisions_total", "Decisions written to the store, by kind",
                          {{"kind", "rehome"}})
                    .inc();
            else
                m.counter("armada_brain_decisions_refused_total",
                          "Decisions the store refused (an epoch or leader fence) or could not write")
                    .inc();
        }
        m.histogram("armada_brain_decision_seconds", "Time to write one round of re-homes", obs::latency_buckets())
            .observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count());
        if (std::any_of(results.begin(), results.end(), newer_leader_wrote)) {
            spdlog::warn("global: a newer leader has written to the store; this brain stops leading");
            deposed_ = true;
            return;
        }
        // Each re-home is a `migrate` span in the session's trace, from the decision to its place
        // request.
        std::vector<obs::Span> spans;
        spans.reserve(decisions.size());
        const int64_t began_ns =
            obs::unix_now_ns() -
            int64_t(
                std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count());
        for (const Rehome & d : decisions) {
            const auto t = traces_.find(d.session);
            obs::Span span = obs::Span::start("migrate", obs::SpanKind::internal,
                                              t != traces_.end() ? std::optional(t->second) : std::nullopt);
            span.start_ns = began_ns;
            span.set("armada.session.id", d.session);
            span.set("gen_ai.conversation.id", d.session);
            span.set("armada.cell.from", d.from);
            span.set("armada.cell", d.to);
            span.set("armada.epoch", d.epoch);
            span.set("armada.brain.epoch", leader_.rev);
            spans.push_back(std::move(span));
        }
        std::map<std::pair<std::string, std::string>, int> moved;
        for (size_t i = 0; i < decisions.size(); ++i) {
            const Rehome & d = decisions[i];
            brain.rehome_done(d.session);  // written or refused: the next read of the store says where it is
            if (!results[i].ok) {
                if (!results[i].fenced) spdlog::warn("global: re-homing {}: {}", d.session, results[i].error);
                spans[i].fail(results[i].fenced ? "fenced" : "the assignment was not written");
                continue;
            }
            ++moved[{d.from, d.to}];
            json place = {{"session", d.session}, {"epoch", d.epoch}};
            // The new cell's `place` span is a child of this one, in the session's trace.
            if (obs::tracer()->enabled())
                place["traceparent"] = spans[i].context().traceparent();
            else if (auto t = traces_.find(d.session); t != traces_.end())
                place["traceparent"] = t->second.traceparent();
            if (auto e =
                    js_->publish_async(place_subject(d.to), place.dump(), d.session + ":" + std::to_string(d.epoch));
                !e.empty())
                spdlog::warn("global: place request for {} to {}: {} (its reconcile finds it)", d.session, d.to, e);
        }
        for (size_t i = 0; i < decisions.size(); ++i) {
            traces_.erase(decisions[i].session);
            obs::tracer()->end(std::move(spans[i]));
        }
        for (const auto & [ft, n] : moved)
            spdlog::info("global: re-homed {} session(s) of lost cell {} to cell {}", n, ft.first, ft.second);
    }

    //! One turn of the rollout, if one is under way: read its keys, feed the Rollout the live
    //! nodes and the operator's command, write its state under this leader's fence, and only
    //! then ask for the restarts it wants. A new leader builds it from the state written.
    void rollout_turn(const EtcdLeader & me, const Seen & seen) {
        const int64_t wall =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        std::vector<EtcdKv> kvs;
        int64_t rev = 0;
        const std::string prefix = rollout_prefix(cfg_);
        if (auto e = etcd_.list(prefix, kvs, rev); !e.empty()) {
            spdlog::warn("global: cannot read the rollout keys: {}", e);
            return;
        }
        std::optional<RolloutSpec> spec;
        std::optional<RolloutState> state;
        std::optional<RolloutCommand> cmd;
        int64_t state_rev = 0;
        for (const auto & kv : kvs) {
            const std::string what = kv.key.substr(prefix.size());
            if (what == "spec") {
                spec = decode_rollout_spec(kv.value);
                if (!spec) spdlog::warn("global: the rollout spec in etcd is unreadable; ignored");
            } else if (what == "state") {
                state = decode_rollout_state(kv.value);
                state_rev = kv.mod_revision;
            } else if (what == "command") {
                cmd = decode_rollout_command(kv.value);
            }
        }
        if (!spec) {
            rollout_.reset();
            if (restarter_) restarter_->forget_except({});  // nothing is wanted any more
            return;
        }
        if (!rollout_ || rollout_->spec().id != spec->id) {
            if (state && state->id == spec->id && !rollout_active(state->phase)) {  // over, and written
                if (restarter_) restarter_->forget_except({});
                return;
            }
            // A StatefulSet's pods go from the highest ordinal down.
            if (restarter_ && restarter_->highest_ordinal_first()) spec->ordinal_desc = true;
            rollout_.emplace(*spec, state, wall);  // the same id resumes; another one's gens are passed
            asked_.clear();
            spdlog::info("global: rollout {} to {}: {} (wave {})", spec->id, spec->version,
                         state && state->id == spec->id ? "resumed" : "started", rollout_->state().wave);
        }
        Rollout & r = *rollout_;
        const bool was_active = !r.finished();
        if (cmd) r.command(*cmd, wall);
        if (restarter_) {
            for (const auto & [node, ack] : restarter_->acks()) {
                if (!ack.error.empty()) r.restart_failed(node, ack.gen, ack.error, wall);
                if (!ack.note.empty()) r.restart_noted(node, ack.gen, ack.note, ack.others);
            }
        }
        r.fleet(seen.nodes, wall);
        const auto wanted = r.decide(wall);
        if (!restarter_) {
            for (const auto & q : wanted)
                r.restart_failed(q.node, q.gen,
                                 kube_error_.empty() ? "this global brain has no --restarter"
                                                     : "--restarter kubernetes: " + kube_error_,
                                 wall);
        }
        if (r.take_changed() || wall - state_written_ms_ >= 5000 || !state || state->id != spec->id) {
            RolloutState out = r.state();
            out.updated_ms = wall;  // `status` tells a live rollout from one no brain runs
            bool ok = false;
            int64_t at = 0;
            const std::vector<EtcdCompare> fence{{EtcdCompare::Target::Mod, prefix + "state", state_rev},
                                                 {EtcdCompare::Target::Create, me.key, me.rev}};
            const auto e = etcd_.txn(fence, {{prefix + "state", encode_rollout_state(out)}}, ok, at);
            if (!e.empty() || !ok) {
                spdlog::warn("global: rollout state not written: {}", e.empty() ? "fenced (read again)" : e);
                rollout_.reset();  // built again from what etcd holds
                if (e.empty() && !elected_.still_leader(me, global_election(cfg_))) deposed_ = true;
                return;
            }
            state_written_ms_ = wall;
        }
        if (was_active && r.finished())
            spdlog::info("global: rollout {} {}: {}", spec->id, r.state().phase, r.state().reason);
        obs::Registry & m = elected_.metrics();
        for (const char * ph : {"running", "paused", "rolling_back", "halted", "aborted", "done"})
            m.gauge("armada_rollout_phase", "The rollout's phase (1 for the current one)", {{"phase", ph}})
                .set(r.state().phase == ph ? 1 : 0);
        m.gauge("armada_rollout_wave", "The rollout's current wave").set(r.state().wave);
        if (!restarter_) return;
        restarter_->forget_except(wanted);
        for (const auto & q : wanted) {
            if (asked_[q.node] == q.gen) continue;
            if (auto e = restarter_->restart(q, spec->id, me); !e.empty()) {
                spdlog::warn("global: rollout: restart of {} at {}: {} (asked again)", q.node, q.version, e);
                continue;
            }
            asked_[q.node] = q.gen;
            m.counter("armada_rollout_restarts_total", "Node restarts a rollout asked for").inc();
            spdlog::info("global: rollout {}: restart {} ({}) on {} (gen {})", spec->id, q.node, q.cell, q.version,
                         q.gen);
        }
    }

    void lead(const EtcdLeader & me) {
        leader_ = {global_election(cfg_), me.rev};
        deposed_ = false;
        if (!elected_.claim_store(*store_, leader_.election, me)) return;
        std::vector<CellSpec> specs;
        for (const auto & c : cfg_.cells)
            specs.push_back({c.name, c.domain, c.water});
        GlobalBrain brain(specs);
        std::set<std::string> known;
        for (const auto & c : specs)
            known.insert(c.name);
        std::set<std::string> was_lost, was_silent;
        int64_t last_etcd_status = 0;
        // Subscribed while leading only: a standby would pile up reports it never reads.
        reports_.reset();
        int64_t subscribe_at = 0;
        last_pushed_.clear();
        last_written_.clear();
        report_rev_.clear();
        paths_.clear();
        // A path is live while a new report came through it within this window.
        const int64_t fresh_ms = std::max<int64_t>(3000, int64_t(cfg_.lease_ttl_s) * 1000);
        bool heard = false;  // a report has come since this brain leads: its split is worth writing
        std::string last_shares;
        std::set<std::string> last_full;  // the cells the split last named full
        int64_t last_shares_ms = 0, last_written_ms = 0, last_check = brain_now_ms(), survival_at = 0;
        while (!elected_.stopping()) {
            elected_.beat();  // the loop moves: a stall past most of a lease TTL gives the lead up
            const int64_t t = brain_now_ms();
            if (!reports_ && t >= subscribe_at) {
                std::string err;
                reports_ = js_->subscribe(report_subject(">"), err);
                if (!reports_) {
                    spdlog::warn("global: cell reports on NATS: {} (etcd's are read; trying again in 5 s)", err);
                    subscribe_at = t + 5000;
                }
            }
            Seen seen;
            const bool looked = look(seen);
            auto fresh = pushed();
            for (const auto & [cell, r] : fresh)
                last_pushed_[cell] = t;
            // Only a new report counts: from NATS, or one whose etcd revision moved. A brain whose
            // loop is stuck keeps its lease (another thread renews it) but writes nothing new, and
            // once its aggregate stops for the brain's report TTL the cell is lost.
            for (auto & [cell, r] : seen.reports) {
                int64_t & rev = report_rev_[cell];
                if (seen.report_rev[cell] == rev) continue;
                rev = seen.report_rev[cell];
                last_written_[cell] = t;
                fresh.try_emplace(cell, r);  // one pushed on NATS is the newer of the two
            }
            for (const auto & [cell, r] : fresh) {
                if (cfg_.cells.empty() && known.insert(cell).second) brain.add_cell({cell, "", 0.57});
                brain.report(r, t);
                heard = true;
            }
            if (t - survival_at >= 5000) {
                // Chain survival per cell and for the cluster, from the rows of every shard.
                survival_at = t;
                const int64_t wall = std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count();
                if (auto rows = store_->ended_since("", wall - kSurvivalWindowMs)) {
                    auto by = cluster::survival_by_cell(*rows);
                    for (const auto & cell : known)
                        by[cell];  // a cell with none ended in the window: zeros, and no ratio
                    survival_metrics(elected_.metrics(), by, true);
                }
            }
            const auto recent = [&](const std::map<std::string, int64_t> & at, const std::string & cell) {
                const auto p = at.find(cell);
                return p != at.end() && t - p->second <= fresh_ms;
            };
            for (const auto & cell : known)
                note_paths(cell, recent(last_written_, cell), recent(last_pushed_, cell));
            if (looked) {
                for (const auto & cell : known) {
                    if (!seen.alive.count(cell)) brain.leases_gone(cell);
                    const auto n = seen.live_nodes.find(cell);
                    const int live = n == seen.live_nodes.end() ? 0 : n->second;
                    brain.node_leases(cell, live);
                    const bool silent = brain.stale(cell, t) && !brain.lost(cell, t);
                    if (silent && was_silent.insert(cell).second)
                        spdlog::warn(
                            "global: cell {} does not report, but {} of its nodes hold live leases: it gets no new "
                            "sessions, and none of its sessions is re-homed while they live",
                            cell, live);
                    else if (!silent)
                        was_silent.erase(cell);
                }
            }
            for (const auto & cell : brain.lost_cells(t)) {
                std::vector<GlobalBrain::OpenSession> open;
                const auto rows = store_->open_sessions(cell, "", kEndedStates);
                if (!rows) continue;  // not "emptied": read again next turn
                for (const auto & r : *rows) {
                    open.push_back({r.id, r.owner, r.epoch});
                    if (auto tc = agent::SessionManager::record_trace(r.data)) traces_[r.id] = std::move(*tc);
                }
                if (was_lost.insert(cell).second)
                    spdlog::warn(
                        "global: cell {} is lost (every lease gone, or no report and no live node); {} open session(s) "
                        "to re-home",
                        cell, open.size());
                brain.open_in(cell, open);
            }
            for (auto it = was_lost.begin(); it != was_lost.end();) {
                if (brain.lost(*it, t)) {
                    ++it;
                    continue;
                }
                spdlog::info("global: cell {} is back", *it);
                it = was_lost.erase(it);
            }
            carry_out(brain, brain.decide(t));
            if (deposed_) break;
            if (looked) rollout_turn(me, seen);
            if (deposed_) break;
            // The split every --shares-ms; and at once when a cell reaches its water level or
            // falls back under it, so that a burst of new sessions does not overshoot it by what
            // comes in one period. Written without a lease: gateways keep the last split while no
            // brain leads, and a new leader writes nothing before it has heard from a cell.
            const Shares split = heard ? brain.shares(t) : Shares{};
            if (heard && (split.full != last_full || t - last_shares_ms >= o_.shares_ms)) {
                const std::string s = encode_shares(split);
                if (s != last_shares || t - last_written_ms >= 30000) {
                    if (auto e = etcd_.put(shares_key(cfg_), s, 0); e.empty()) {
                        last_shares = s;
                        last_written_ms = t;
                    } else {
                        spdlog::warn("global: cannot write the shares: {}", e);
                    }
                }
                last_full = split.full;
                last_shares_ms = t;
            }
            if (t - last_check >= 1000) {
                last_check = t;
                if (!elected_.still_leader(me, global_election(cfg_))) break;
            }
            if (t - last_etcd_status >= 10000) {
                last_etcd_status = t;
                etcd_metrics(elected_.metrics(), etcd_);
            }
            if (elected_.wait_signal(o_.tick_ms)) break;
        }
        reports_.reset();
        rollout_.reset();  // the next leader (maybe this brain again) resumes it from etcd
        // Only the leader speaks for the cells and the cluster.
        elected_.metrics().erase_families("armada_rollout_");
        elected_.metrics().erase_families("armada_cell_");
        elected_.metrics().erase_families("armada_cluster_");
        elected_.metrics().erase_families("armada_etcd_");
    }

    ClusterConfig cfg_;
    GlobalOptions o_;
    EtcdClient etcd_;
    Elected elected_;
    std::shared_ptr<void> metrics_http_;  // the metrics listener, while it runs
    std::unique_ptr<store::Store> store_;
    std::unique_ptr<JetStream> js_;
    std::unique_ptr<Subscription> reports_;
    store::Batch::Leadership leader_;              // while it leads
    bool deposed_ = false;                         // a newer leader wrote: it stops leading
    std::map<std::string, int64_t> last_pushed_;   // cell → when its last NATS report came
    std::map<std::string, int64_t> last_written_;  // cell → when its etcd report last changed
    std::map<std::string, int64_t> report_rev_;    // cell → its etcd report's last mod_revision
    std::map<std::string, int> paths_;             // cell → the paths last logged (bit 1 etcd, 2 NATS)
    std::unique_ptr<RestartLedger> ledger_;        // before the restarter that uses it
    std::unique_ptr<NodeRestarter> restarter_;
    std::string kube_error_;                // none: rollouts halt at once
    std::optional<Rollout> rollout_;        // the rollout under way, while leading
    std::map<std::string, int64_t> asked_;  // node → the restart gen asked for
    int64_t state_written_ms_ = 0;
    // The trace each open session of a lost cell is in (from its row): its re-home's `migrate`
    // span goes in it. Filled at each read of a lost cell; an entry goes once its session is
    // re-homed (those of a cell that came back stay, bounded by the sessions it had).
    std::unordered_map<std::string, obs::TraceContext> traces_;
};

}  // namespace

int global_command(const GlobalOptions & opt) {
    const sigset_t stop_set = block_stop_signals();
    spdlog::set_level(spdlog::level::from_str(opt.log_level));
    std::string err;
    auto cfg = load_cluster_config_for_service(opt.cluster_file, err);
    if (!cfg) {
        fprintf(stderr, "error: %s\n", err.c_str());
        return 2;
    }
    GlobalOptions o = opt;
    if (o.name.empty()) {
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        o.name = std::string(host) + "-" + std::to_string(getpid());
    }
    return GlobalProcess(*cfg, o, stop_set).run();
}

}  // namespace armada::cli

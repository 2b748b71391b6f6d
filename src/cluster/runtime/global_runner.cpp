#include "cluster/runtime/global_runner.h"
#include "common/backoff.h"

#include "cluster/membership.h"
#include "cluster/queue.h"
#include "cluster/runtime/elected.h"
#include "cluster/survival.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

namespace armada::cluster {

namespace {

using json = nlohmann::json;
using Kind = ClusterKeys::Parsed::Kind;

}  // namespace

GlobalRunner::GlobalRunner(GlobalRunnerConfig cfg, KvStore & kv, Bus & bus, store::Store & store, Clock & clock,
                           obs::Registry & metrics, NodeRestarter * restarter, std::string restarter_error)
    : cfg_(std::move(cfg)),
      keys_(cfg_.prefix),
      kv_(kv),
      bus_(bus),
      store_(store),
      clock_(clock),
      metrics_(metrics),
      restarter_(restarter),
      restarter_error_(std::move(restarter_error)) {}

GlobalRunner::~GlobalRunner() = default;

void GlobalRunner::lead(Leadership & term) {
    if (!begin(term)) return;
    while (turn(term)) {
        if (term.wait_stop(cfg_.tick_ms)) break;
    }
    end();
}

bool GlobalRunner::begin(Leadership & term) {
    leader_ = {keys_.global_election(), term.me().rev};
    deposed_ = false;
    if (!term.claim_store(store_)) return false;
    brain_ = std::make_unique<GlobalBrain>(cfg_.cells);
    known_.clear();
    for (const auto & c : cfg_.cells)
        known_.insert(c.name);
    was_lost_.clear();
    was_silent_.clear();
    // Subscribed while leading only: a standby would pile up reports it never reads.
    reports_.reset();
    subscribe_at_ = 0;
    cells_ = std::make_unique<Informer>(kv_, keys_.cells(), clock_, cfg_.relist_ms,
                                        common::Backoff(250, 4000, cfg_.seed ? cfg_.seed : std::random_device{}()));
    last_pushed_.clear();
    last_written_.clear();
    report_rev_.clear();
    paths_.clear();
    heard_ = false;
    last_shares_.clear();
    last_full_.clear();
    last_shares_ms_ = last_written_ms_ = survival_at_ = last_etcd_status_ = 0;
    last_check_ = clock_.now_ms();
    return true;
}

void GlobalRunner::end() {
    reports_.reset();
    cells_.reset();
    brain_.reset();
    rollout_.reset();  // the next leader (maybe this brain again) resumes it from etcd
    ended_.clear();
    // Only the leader speaks for the cells and the cluster.
    metrics_.erase_families("armada_rollout_");
    metrics_.erase_families("armada_cell_");
    metrics_.erase_families("armada_cluster_");
    metrics_.erase_families("armada_etcd_");
}

bool GlobalRunner::look(Seen & out) {
    std::vector<EtcdEvent> changes;
    std::string err;
    if (!cells_->poll(changes, 0, err)) {
        spdlog::warn("global: cannot read the cells: {}", err);
        return false;
    }
    for (const auto & [key, kv] : cells_->view()) {
        const auto k = keys_.parse(key);
        if (k.kind == Kind::CellReport) {
            out.alive.insert(k.cell);
            if (auto r = decode_cell_report(k.cell, kv.value)) {
                out.reports[k.cell] = *r;
                out.report_rev[k.cell] = kv.mod_revision;
            }
        } else if (k.kind == Kind::Node) {
            out.alive.insert(k.cell);
            out.live_nodes[k.cell]++;
            if (auto l = decode_load(k.name, kv.value))
                out.nodes.push_back({k.name, k.cell, l->version, l->draining, l->signals});
        } else if (k.kind == Kind::CellElection) {
            out.alive.insert(k.cell);  // a brain's candidacy is under its lease too
        }
    }
    return true;
}

std::map<std::string, CellReport> GlobalRunner::pushed() {
    // The cells' reports pushed on the bus since the last look, the newest per cell. A cell whose
    // brain cannot write to etcd still reports here, and a report here is fresher than the one
    // read back from etcd.
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

void GlobalRunner::note_paths(const std::string & cell, bool etcd, bool nats) {
    // Said once per cell, and again when it changes.
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

bool GlobalRunner::turn(Leadership & term) {
    term.beat();  // the loop moves: a stall past most of a lease TTL gives the lead up
    const int64_t t = clock_.now_ms();
    if (!reports_ && t >= subscribe_at_) {
        std::string err;
        reports_ = bus_.subscribe(report_subject(">"), err);
        if (!reports_) {
            spdlog::warn("global: cell reports on NATS: {} (etcd's are read; trying again in 5 s)", err);
            subscribe_at_ = t + 5000;
        }
    }
    GlobalBrain & brain = *brain_;
    Seen seen;
    const bool looked = look(seen);
    auto fresh = pushed();
    for (const auto & [cell, r] : fresh)
        last_pushed_[cell] = t;
    // Only a new report counts: from the bus, or one whose revision moved. A brain whose loop is
    // stuck keeps its lease a while but writes nothing new, and once its aggregate stops for the
    // brain's report TTL the cell is stale.
    for (auto & [cell, r] : seen.reports) {
        int64_t & rev = report_rev_[cell];
        if (seen.report_rev[cell] == rev) continue;
        rev = seen.report_rev[cell];
        last_written_[cell] = t;
        fresh.try_emplace(cell, r);  // one pushed on the bus is the newer of the two
    }
    bool ended_changed = false;  // a cell's report brought new survival figures
    for (const auto & [cell, r] : fresh) {
        if (cfg_.cells.empty() && known_.insert(cell).second) brain.add_cell({cell, "", 0.57});
        brain.report(r, t);
        heard_ = true;
        // (Empty: its brain has not read them yet.)
        if (!r.ended.empty() && ended_[cell] != r.ended) {
            ended_[cell] = r.ended;
            ended_changed = true;
        }
    }
    if (t - survival_at_ >= 5000 || survival_at_ == 0 || ended_changed) {
        // Chain survival per cell and for the cluster, from what each cell's brain read of its own
        // rows (in its report): the global leader does not read every ended row of the cluster
        // again. A cell whose brains are away keeps its last figures.
        survival_at_ = t;
        std::map<std::string, Survival> by;
        Survival & all = by[""];
        for (const auto & cell : known_)
            by[cell];  // a cell with none ended in the window: zeros, and no ratio
        for (const auto & row : ended_) {
            const auto & ended = row.second;  // a name, not a structured binding: the lambda takes it
            Survival & s = by[row.first];
            const auto n = [&](const char * k) {
                const auto it = ended.find(k);
                return it == ended.end() ? int64_t(0) : it->second;
            };
            s = {};
            s.completed = n("completed");
            s.failed = n("failed");
            s.timed_out = n("timed_out");
            s.lost = n("lost");
            s.cancelled = n("cancelled");
            all.completed += s.completed;
            all.failed += s.failed;
            all.timed_out += s.timed_out;
            all.lost += s.lost;
            all.cancelled += s.cancelled;
        }
        survival_metrics(metrics_, by, true);
    }
    // A path is live while a new report came through it within this window.
    const int64_t fresh_ms = std::max<int64_t>(3000, int64_t(cfg_.lease_ttl_s) * 1000);
    const auto recent = [&](const std::map<std::string, int64_t> & at, const std::string & cell) {
        const auto p = at.find(cell);
        return p != at.end() && t - p->second <= fresh_ms;
    };
    for (const auto & cell : known_)
        note_paths(cell, recent(last_written_, cell), recent(last_pushed_, cell));
    if (looked) {
        for (const auto & cell : known_) {
            if (!seen.alive.count(cell)) brain.leases_gone(cell);
            const auto n = seen.live_nodes.find(cell);
            const int live = n == seen.live_nodes.end() ? 0 : n->second;
            brain.node_leases(cell, live);
            const bool silent = brain.stale(cell, t) && !brain.lost(cell, t);
            if (silent && was_silent_.insert(cell).second)
                spdlog::warn(
                    "global: cell {} does not report, but {} of its nodes hold live leases: it gets no new sessions, "
                    "and none of its sessions is re-homed while they live",
                    cell, live);
            else if (!silent)
                was_silent_.erase(cell);
        }
    }
    for (const auto & cell : brain.lost_cells(t)) {
        std::vector<GlobalBrain::OpenSession> open;
        const auto rows = store_.open_sessions(cell, "", kEndedStates);
        if (!rows) continue;  // not "emptied": read again next turn
        for (const auto & r : *rows) {
            open.push_back({r.id, r.owner, r.epoch});
            if (auto tc = obs::TraceContext::in_record(r.data)) traces_[r.id] = std::move(*tc);
        }
        if (was_lost_.insert(cell).second)
            spdlog::warn(
                "global: cell {} is lost (every lease gone, or no report and no live node); {} open session(s) to "
                "re-home",
                cell, open.size());
        brain.open_in(cell, open);
    }
    for (auto it = was_lost_.begin(); it != was_lost_.end();) {
        if (brain.lost(*it, t)) {
            ++it;
            continue;
        }
        spdlog::info("global: cell {} is back", *it);
        it = was_lost_.erase(it);
    }
    term.beat();
    carry_out(term, brain.decide(t));
    if (deposed_) return false;
    if (looked) rollout_turn(term, seen);
    if (deposed_) return false;
    write_shares(t);
    if (t - last_check_ >= 1000) {
        last_check_ = t;
        if (!term.still_leader()) return false;
    }
    if (t - last_etcd_status_ >= cfg_.etcd_status_ms || last_etcd_status_ == 0) {
        last_etcd_status_ = t;
        etcd_metrics(metrics_, kv_);
    }
    return true;
}

void GlobalRunner::write_shares(int64_t t) {
    // The split every shares_ms; and at once when a cell reaches its water level or falls back
    // under it, so that a burst of new sessions does not overshoot it by what comes in one
    // period. Written without a lease: gateways keep the last split while no brain leads, and a
    // new leader writes nothing before it has heard from a cell.
    if (!heard_) return;
    const Shares split = brain_->shares(t);
    if (split.full == last_full_ && t - last_shares_ms_ < cfg_.shares_ms) return;
    const std::string s = encode_shares(split);
    if (s != last_shares_ || t - last_written_ms_ >= 30000) {
        if (auto e = kv_.put(keys_.shares(), s, 0); e.empty()) {
            last_shares_ = s;
            last_written_ms_ = t;
        } else {
            spdlog::warn("global: cannot write the shares: {}", e);
        }
    }
    last_full_ = split.full;
    last_shares_ms_ = t;
}

void GlobalRunner::carry_out(Leadership & term, const std::vector<Rehome> & decisions) {
    // Each re-home as its own epoch-checked batch (grouped into one transaction), then a place
    // request to the new cell's brain.
    if (decisions.empty()) return;
    const auto since = std::chrono::steady_clock::now();
    std::vector<store::Batch> batches(decisions.size());
    for (size_t i = 0; i < decisions.size(); ++i) {
        batches[i].assign.push_back({decisions[i].session, "", decisions[i].epoch, decisions[i].to});
        batches[i].leader = leader_;
    }
    const auto results = commit_each(store_, std::move(batches));
    for (const auto & r : results) {
        if (r.ok)
            metrics_
                .counter("armada_brain_decisions_total", "Decisions written to the store, by kind",
                         {{"kind", "rehome"}})
                .inc();
        else
            metrics_
                .counter("armada_brain_decisions_refused_total",
                         "Decisions the store refused (an epoch or leader fence) or could not write")
                .inc();
    }
    metrics_.histogram("armada_brain_decision_seconds", "Time to write one round of re-homes", obs::latency_buckets())
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
        int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count());
    for (const Rehome & d : decisions) {
        const auto tr = traces_.find(d.session);
        obs::Span span = obs::Span::start("migrate", obs::SpanKind::internal,
                                          tr != traces_.end() ? std::optional(tr->second) : std::nullopt);
        span.start_ns = began_ns;
        span.set("armada.session.id", d.session);
        span.set("gen_ai.conversation.id", d.session);
        span.set("armada.cell.from", d.from);
        span.set("armada.cell", d.to);
        span.set("armada.epoch", d.epoch);
        span.set("armada.brain.epoch", term.me().rev);
        spans.push_back(std::move(span));
    }
    std::map<std::pair<std::string, std::string>, int> moved;
    for (size_t i = 0; i < decisions.size(); ++i) {
        const Rehome & d = decisions[i];
        brain_->rehome_done(d.session);  // written or refused: the next read of the store says where it is
        if (!results[i].ok) {
            if (!results[i].fenced) spdlog::warn("global: re-homing {}: {}", d.session, results[i].error);
            spans[i].fail(results[i].fenced ? "fenced" : "the assignment was not written");
            continue;
        }
        ++rehomed_;
        ++moved[{d.from, d.to}];
        json place = {{"session", d.session}, {"epoch", d.epoch}};
        // The new cell's `place` span is a child of this one, in the session's trace.
        if (obs::tracer()->enabled())
            place["traceparent"] = spans[i].context().traceparent();
        else if (auto tr = traces_.find(d.session); tr != traces_.end())
            place["traceparent"] = tr->second.traceparent();
        if (auto e = bus_.publish_async(place_subject(d.to), place.dump(), d.session + ":" + std::to_string(d.epoch));
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

void GlobalRunner::rollout_turn(Leadership & term, const Seen & seen) {
    // Read its keys, feed the Rollout the live nodes and the operator's command, write its state
    // under this leader's fence, and only then ask for the restarts it wants. A new leader builds
    // it from the state written.
    const int64_t wall = clock_.wall_ms();
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    if (auto e = kv_.list(keys_.rollout(), kvs, rev); !e.empty()) {
        spdlog::warn("global: cannot read the rollout keys: {}", e);
        return;
    }
    std::optional<RolloutSpec> spec;
    std::optional<RolloutState> state;
    std::optional<RolloutCommand> cmd;
    int64_t state_rev = 0;
    for (const auto & kv : kvs) {
        switch (keys_.parse(kv.key).kind) {
            case Kind::RolloutSpec:
                spec = decode_rollout_spec(kv.value);
                if (!spec) spdlog::warn("global: the rollout spec in etcd is unreadable; ignored");
                break;
            case Kind::RolloutState:
                state = decode_rollout_state(kv.value);
                state_rev = kv.mod_revision;
                break;
            case Kind::RolloutCommand:
                cmd = decode_rollout_command(kv.value);
                break;
            default:
                break;
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
                             restarter_error_.empty() ? "this global brain has no --restarter"
                                                      : "--restarter kubernetes: " + restarter_error_,
                             wall);
    }
    const EtcdLeader & me = term.me();
    if (r.take_changed() || wall - state_written_ms_ >= 5000 || !state || state->id != spec->id) {
        RolloutState out = r.state();
        out.updated_ms = wall;  // `status` tells a live rollout from one no brain runs
        bool ok = false;
        int64_t at = 0;
        const std::vector<EtcdCompare> fence{{EtcdCompare::Target::Mod, keys_.rollout_state(), state_rev},
                                             {EtcdCompare::Target::Create, me.key, me.rev}};
        const auto e = kv_.txn(fence, {{keys_.rollout_state(), encode_rollout_state(out)}}, ok, at);
        if (!e.empty() || !ok) {
            spdlog::warn("global: rollout state not written: {}", e.empty() ? "fenced (read again)" : e);
            rollout_.reset();  // built again from what etcd holds
            if (e.empty() && !term.still_leader()) deposed_ = true;
            return;
        }
        state_written_ms_ = wall;
    }
    if (was_active && r.finished())
        spdlog::info("global: rollout {} {}: {}", spec->id, r.state().phase, r.state().reason);
    for (const char * ph : {"running", "paused", "rolling_back", "halted", "aborted", "done"})
        metrics_.gauge("armada_rollout_phase", "The rollout's phase (1 for the current one)", {{"phase", ph}})
            .set(r.state().phase == ph ? 1 : 0);
    metrics_.gauge("armada_rollout_wave", "The rollout's current wave").set(r.state().wave);
    // The gates' four signals as the last judgement read them: the wave's nodes, the rest of the
    // fleet, the fleet before the wave, and the limit the wave must stay under.
    metrics_.erase_families("armada_rollout_gate_");
    for (const auto & g : r.state().gates) {
        obs::Labels l{{"signal", g.signal}};
        if (!g.code.empty()) l.emplace_back("code", g.code);
        for (const auto & [group, v] :
             {std::pair<const char *, double>{"upgraded", g.upgraded}, {"rest", g.rest}, {"before", g.before}}) {
            obs::Labels lg = l;
            lg.emplace_back("group", group);
            metrics_.gauge("armada_rollout_gate_value", "A rollout gate's signal, by group of nodes", lg).set(v);
        }
        metrics_.gauge("armada_rollout_gate_limit", "The value of a gate's signal on the wave that fires it", l)
            .set(g.limit);
        metrics_.gauge("armada_rollout_gate_judged", "1 when the wave had the sample the gate needs", l)
            .set(g.judged ? 1 : 0);
        metrics_.gauge("armada_rollout_gate_fired", "1 when the gate fired (the rollout halts)", l)
            .set(g.fired ? 1 : 0);
    }
    if (!restarter_) return;
    restarter_->forget_except(wanted);
    for (const auto & q : wanted) {
        if (asked_[q.node] == q.gen) continue;
        if (auto e = restarter_->restart(q, spec->id, me); !e.empty()) {
            spdlog::warn("global: rollout: restart of {} at {}: {} (asked again)", q.node, q.version, e);
            continue;
        }
        asked_[q.node] = q.gen;
        metrics_.counter("armada_rollout_restarts_total", "Node restarts a rollout asked for").inc();
        spdlog::info("global: rollout {}: restart {} ({}) on {} (gen {})", spec->id, q.node, q.cell, q.version, q.gen);
    }
}

}  // namespace armada::cluster

#include "cluster/rollout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace armada::cluster {

// --- the rollout ---

namespace {

constexpr size_t kMaxHistory = 20;
constexpr int64_t kMinAnomalies = 3;  // on the wave, for the heartbeat gate to fire

//! What a node counted between two reports; a new process (another `started_ms`) counts from 0.
GroupSignals delta(const NodeSignals & now, const NodeSignals * was, double minutes) {
    const bool same = was && was->started_ms == now.started_ms;
    const auto d = [&](int64_t a, int64_t b) { return std::max<int64_t>(0, a - (same ? b : 0)); };
    GroupSignals g;
    g.node_minutes = minutes;
    g.steps = d(now.steps, was ? was->steps : 0);
    g.step_s = std::max(0.0, now.step_s - (same ? was->step_s : 0.0));
    g.completed = d(now.completed, was ? was->completed : 0);
    g.failed = d(now.failed, was ? was->failed : 0);
    for (const auto & [code, n] : now.errors) {
        const auto it = same ? was->errors.find(code) : now.errors.end();
        const int64_t v = std::max<int64_t>(0, n - (same && it != was->errors.end() ? it->second : 0));
        if (v > 0) g.errors[code] = v;
    }
    g.heartbeat = d(now.renew_late, was ? was->renew_late : 0) + d(now.renew_failed, was ? was->renew_failed : 0) +
                  d(now.lease_lost, was ? was->lease_lost : 0);
    return g;
}

//! The number a StatefulSet pod's name ends in (-1: none).
long ordinal(const std::string & node) {
    size_t i = node.size();
    while (i > 0 && node[i - 1] >= '0' && node[i - 1] <= '9')
        --i;
    if (i == node.size() || node.size() - i > 9) return -1;
    return std::stol(node.substr(i));
}

//! A StatefulSet pod's set: its name without the ordinal.
std::string set_of(const std::string & node) {
    size_t i = node.size();
    while (i > 0 && node[i - 1] >= '0' && node[i - 1] <= '9')
        --i;
    return node.substr(0, i);
}

GateReading reading(const char * signal, const std::string & code, double up, double rest, double before) {
    GateReading r;
    r.signal = signal;
    r.code = code;
    r.upgraded = up;
    r.rest = rest;
    r.before = before;
    return r;
}

std::string num(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", v);
    return b;
}

}  // namespace

Rollout::Rollout(RolloutSpec spec, std::optional<RolloutState> persisted, int64_t now_ms) : spec_(std::move(spec)) {
    // Gens grow across rollouts too (a restarter acts on a node's gen once): each rollout counts
    // from its start time in ms times 1,000 (exact in JSON's doubles, under 2^53), and never from
    // below where the previous rollout stopped, whatever the clock of the host that started it.
    const int64_t previous_gen = persisted && persisted->id != spec_.id ? persisted->next_gen : 0;
    if (persisted && persisted->id == spec_.id) {
        st_ = std::move(*persisted);
        // The old leader's counters are gone: a wave that was settling settles again.
        if (st_.settle_from_ms > 0) st_.settle_from_ms = now_ms;
    } else {
        st_.id = spec_.id;
        st_.version = spec_.version;
        st_.phase = "running";
        st_.next_gen = std::max<int64_t>({1, spec_.at_ms * 1000, previous_gen});
    }
    st_.updated_ms = now_ms;
    born_ms_ = now_ms;
}

bool Rollout::take_changed() {
    const bool c = changed_;
    changed_ = false;
    return c;
}

void Rollout::fleet(const std::vector<FleetNode> & live, int64_t now_ms) {
    const bool first_turn = last_turn_ms_ == 0;
    const double minutes = first_turn ? 0 : double(std::clamp<int64_t>(now_ms - last_turn_ms_, 0, 10000)) / 60000.0;
    last_turn_ms_ = now_ms;
    const bool settling = st_.settle_from_ms > 0;
    std::map<std::string, FleetNode> seen;
    GroupSignals fleet_sum;
    for (const auto & n : live) {
        const auto was = last_.find(n.node);
        // On this brain's first turn nothing has a baseline: counts start with the next. A node
        // that appears later is a new process, all of whose counts are new.
        const GroupSignals g =
            first_turn ? GroupSignals{} : delta(n.signals, was == last_.end() ? nullptr : &was->second, minutes);
        fleet_sum.add(g);
        if (settling) {
            const auto w = st_.wave_nodes.find(n.node);
            (w != st_.wave_nodes.end() && w->second.phase == "ready" ? wave_sig_ : rest_sig_).add(g);
        }
        last_[n.node] = n.signals;
        seen[n.node] = n;
    }
    // A key gone from a node not being restarted is a heartbeat anomaly.
    for (const auto & [name, n] : live_) {
        if (seen.count(name)) continue;
        const auto w = st_.wave_nodes.find(name);
        const bool restarting =
            w != st_.wave_nodes.end() && (w->second.phase == "restarting" || w->second.phase == "rolling_back");
        if (restarting) continue;
        if (n.version != spec_.version && !st_.away.count(name)) {
            st_.away[name] = {n.version, now_ms};
            change();
        }
        fleet_sum.heartbeat++;
        if (settling) (w != st_.wave_nodes.end() && w->second.phase == "ready" ? wave_sig_ : rest_sig_).heartbeat++;
    }
    live_ = std::move(seen);
    // A drain's hold counts from when it began: one that ended (or whose node moved on) starts over.
    std::erase_if(drain_held_since_, [&](const auto & kv) {
        const auto n = live_.find(kv.first);
        return n == live_.end() || !n->second.draining || n->second.version == spec_.version;
    });
    if (std::erase_if(st_.away, [&](const auto & a) { return live_.count(a.first) > 0; }) > 0) change();
    window_.emplace_back(now_ms, fleet_sum);
    while (!window_.empty() && window_.front().first < now_ms - std::max(spec_.settle_ms, spec_.before_ms))
        window_.pop_front();

    // Nodes back on the version asked for.
    for (auto & [name, w] : st_.wave_nodes) {
        if (w.phase != "restarting" && w.phase != "rolling_back") continue;
        const auto it = live_.find(name);
        if (it == live_.end() || it->second.draining || it->second.version != w.to) continue;
        w.phase = w.phase == "restarting" ? "ready" : "rolled_back";
        w.since_ms = now_ms;
        change();
    }
}

void Rollout::command(const RolloutCommand & c, int64_t now_ms) {
    if ((!c.id.empty() && c.id != st_.id) || c.seq <= st_.command_seq) return;
    st_.command_seq = c.seq;
    change();
    if (c.op == "pause" && st_.phase == "running") {
        st_.phase = "paused";
        st_.reason = "paused by the operator";
    } else if (c.op == "resume" && st_.phase == "paused") {
        st_.phase = "running";
        st_.reason.clear();
        blocked_since_.clear();  // a node still held waits its full time again
        drain_held_since_.clear();
    } else if (c.op == "abort" && rollout_active(st_.phase)) {
        if (!c.rollback) {
            // Restarts in flight finish on their own; nothing more is asked for.
            for (auto it = st_.wave_nodes.begin(); it != st_.wave_nodes.end();) {
                if (it->second.phase != "pending") {
                    ++it;
                    continue;
                }
                st_.wave_order.erase(std::remove(st_.wave_order.begin(), st_.wave_order.end(), it->first),
                                     st_.wave_order.end());
                it = st_.wave_nodes.erase(it);
            }
            st_.phase = "aborted";
            st_.reason = "aborted by the operator";
            return;
        }
        // Every node this rollout upgraded goes back too.
        for (const auto & [from, nodes] : st_.upgraded) {
            for (const auto & n : nodes) {
                if (st_.wave_nodes.count(n)) continue;
                const auto cell = st_.upgraded_cell.find(n);
                st_.wave_nodes[n] = {
                    cell == st_.upgraded_cell.end() ? "" : cell->second, from, st_.version, "ready", 0, now_ms};
                st_.wave_order.push_back(n);
            }
        }
        st_.upgraded.clear();
        st_.upgraded_cell.clear();
        halt("aborted by the operator, rolling back", "aborted", now_ms);
    }
}

void Rollout::restart_failed(const std::string & node, int64_t gen, const std::string & why, int64_t now_ms) {
    const auto it = st_.wave_nodes.find(node);
    if (it == st_.wave_nodes.end() || it->second.gen != gen) return;
    if (it->second.phase == "restarting") {
        GateReading r{"ready", "", 0, 0, 0, 0, true, true, node + ": " + why};
        st_.gates = {r};
        st_.fired = "ready fired: " + r.note;
        halt(st_.fired, "halted", now_ms);
    } else if (it->second.phase == "rolling_back") {
        it->second.phase = "failed";
        st_.reason += "; rollback of " + node + " failed: " + why;
        change();
    }
}

void Rollout::restart_noted(const std::string & node, int64_t gen, const std::string & note, int others) {
    const auto it = st_.wave_nodes.find(node);
    if (it == st_.wave_nodes.end() || it->second.gen != gen) return;
    if (it->second.note == note && it->second.others == others) return;
    it->second.note = note;
    it->second.others = std::max(0, others);
    change();
}

bool Rollout::take_token(int64_t now_ms) {
    const double burst = std::max(1.0, spec_.restarts_per_s);
    if (tokens_ < 0) {
        tokens_ = burst;
    } else {
        tokens_ = std::min(burst, tokens_ + double(now_ms - tokens_at_ms_) / 1000.0 * spec_.restarts_per_s);
    }
    tokens_at_ms_ = now_ms;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
}

void Rollout::start_wave(int64_t now_ms) {
    std::map<std::string, std::vector<std::string>> by_cell;
    size_t eligible = 0;
    std::string waiting;  // nodes on another version that drain now: not done before they are back
    for (const auto & [name, n] : live_) {
        if (n.version == spec_.version) continue;
        if (n.draining) {
            waiting += (waiting.empty() ? "" : ", ") + name + " (draining on " + n.version + ")";
            continue;
        }
        by_cell[n.cell].push_back(name);
        eligible++;
    }
    if (eligible == 0) {
        if (live_.empty()) return;  // no report yet
        if (!waiting.empty()) {     // a node to wait for
            const std::string why = "waiting for " + waiting;
            if (st_.reason != why) {
                st_.reason = why;
                change();
            }
            return;
        }
        // A node that went down on an older version may come back on it: wait for it, up to the
        // ready timeout.
        std::string gone;
        for (const auto & [name, a] : st_.away) {
            if (now_ms - a.second < spec_.ready_timeout_ms) return;
            gone += (gone.empty() ? "" : ", ") + name + " (" + a.first + ")";
        }
        st_.phase = "done";
        st_.reason = "every live node runs " + spec_.version;
        if (!gone.empty())
            st_.reason += "; not back after " + std::to_string(spec_.ready_timeout_ms / 1000) +
                          " s, still on an older version when last seen: " + gone;
        st_.updated_ms = now_ms;
        change();
        return;
    }
    if (spec_.ordinal_desc) {
        // A StatefulSet updates its pods from the highest ordinal down: a pod below one still on
        // the old version that drains or is down (and may come back) waits for it.
        std::map<std::string, long> held_below;          // set name -> the highest such ordinal
        std::map<std::string, std::string> holders;      // set -> the pod that holds it, and why
        std::map<std::string, std::string> holder_name;  // set -> that pod
        auto hold = [&](const std::string & name, const std::string & why) {
            const long o = ordinal(name);
            if (o < 0) return;
            auto & h = held_below.try_emplace(set_of(name), -1).first->second;
            if (o > h) {
                holders[set_of(name)] = name + " (" + why + ")";
                holder_name[set_of(name)] = name;
            }
            h = std::max(h, o);
        };
        for (const auto & [name, n] : live_) {
            if (n.version == spec_.version || !n.draining || ordinal(name) < 0) continue;
            hold(name, "draining on " + n.version);
            drain_held_since_.try_emplace(name, now_ms);
        }
        for (const auto & [name, a] : st_.away)
            if (a.first != spec_.version && now_ms - a.second < spec_.ready_timeout_ms)
                hold(name, "down on " + a.first);
        std::set<std::string> holding;  // sets with a pod held
        for (auto & [cell, nodes] : by_cell) {
            std::stable_sort(nodes.begin(), nodes.end(),
                             [](const std::string & a, const std::string & b) { return ordinal(a) > ordinal(b); });
            const size_t before = nodes.size();
            std::erase_if(nodes, [&](const std::string & name) {
                const auto h = held_below.find(set_of(name));
                const bool held = h != held_below.end() && ordinal(name) >= 0 && ordinal(name) < h->second;
                if (held) holding.insert(set_of(name));
                return held;
            });
            eligible -= before - nodes.size();
        }
        // A drain that does not end holds the pods below it: the operator is asked to look.
        for (const auto & set : holding) {
            const std::string & name = holder_name[set];
            const auto d = drain_held_since_.find(name);
            if (d == drain_held_since_.end() || st_.phase != "running" || now_ms - d->second <= spec_.ready_timeout_ms)
                continue;
            st_.phase = "paused";
            st_.reason = name + " has drained for over " + std::to_string(spec_.ready_timeout_ms / 1000) +
                         " s, and the pods of its set below it wait for it (a StatefulSet updates from the "
                         "highest ordinal down): look at it, then resume";
            change();
            return;
        }
        if (eligible == 0) {  // every pod left waits for a higher one
            std::string why = "waiting for";
            for (const auto & [set, h] : holders)
                why += (why.size() > 11 ? ", " : " ") + h;
            why += " before the pods below it";
            if (st_.reason != why) {
                st_.reason = why;
                change();
            }
            return;
        }
    }
    const size_t size =
        std::max<size_t>(1, size_t(std::floor(double(live_.size()) * spec_.wave_percent / 100.0 + 1e-9)));
    // Cell by cell: one node of each in turn.
    std::vector<std::string> picked;
    for (size_t round = 0; picked.size() < size; ++round) {
        bool any = false;
        for (const auto & [cell, nodes] : by_cell) {
            if (round >= nodes.size() || picked.size() >= size) continue;
            picked.push_back(nodes[round]);
            any = true;
        }
        if (!any) break;
    }
    st_.wave++;
    st_.waves = st_.wave - 1 + int((eligible + size - 1) / size);
    st_.wave_nodes.clear();
    st_.wave_order = picked;
    for (const auto & name : picked) {
        const auto & n = live_.at(name);
        st_.wave_nodes[name] = {n.cell, n.version, spec_.version, "pending", 0, now_ms};
    }
    st_.wave_started_ms = now_ms;
    st_.settle_from_ms = 0;
    st_.before = {};
    for (const auto & [t, g] : window_)
        st_.before.add(g);
    st_.gates.clear();
    st_.reason.clear();
    change();
}

void Rollout::start_restarts(int64_t now_ms, const std::string & phase_from, const std::string & phase_to) {
    std::map<std::string, int> busy;  // restarting or rolling back, by cell
    for (const auto & [name, w] : st_.wave_nodes)
        if (w.phase == "restarting" || w.phase == "rolling_back") busy[w.cell]++;
    for (const auto & name : st_.wave_order) {
        auto & w = st_.wave_nodes.at(name);
        if (w.phase != phase_from || busy[w.cell] >= spec_.max_per_cell) {
            blocked_since_.erase(name);
            continue;
        }
        // Another node of the cell draining outside the wave (an operator's drain) means the
        // cell is short already. (The wave's own restarts are bounded by max_per_cell.)
        const auto blocker = std::find_if(live_.begin(), live_.end(), [&](const auto & kv) {
            if (kv.first == name || kv.second.cell != w.cell || !kv.second.draining) return false;
            const auto o = st_.wave_nodes.find(kv.first);
            return o == st_.wave_nodes.end() || (o->second.phase != "restarting" && o->second.phase != "rolling_back");
        });
        if (blocker != live_.end()) {
            // Held too long (a drain that does not end): the operator is asked to look.
            const int64_t since = blocked_since_.try_emplace(name, now_ms).first->second;
            if (phase_from == "pending" && st_.phase == "running" && now_ms - since > spec_.ready_timeout_ms) {
                st_.phase = "paused";
                st_.reason = name + " has waited over " + std::to_string(spec_.ready_timeout_ms / 1000) +
                             " s to restart while " + blocker->first + " of cell " + w.cell +
                             " drains; resume once that drain is over";
                change();
                return;
            }
            continue;
        }
        blocked_since_.erase(name);
        if (!take_token(now_ms)) continue;
        w.phase = phase_to;
        w.gen = st_.next_gen++;
        w.since_ms = now_ms;
        w.note.clear();  // the restarter's word on an earlier gen
        w.others = 0;
        busy[w.cell]++;
        change();
    }
}

void Rollout::halt(const std::string & why, const std::string & after, int64_t now_ms) {
    std::vector<std::string> nodes;
    for (auto it = st_.wave_nodes.begin(); it != st_.wave_nodes.end();) {
        auto & w = it->second;
        if (w.phase == "pending") {
            st_.wave_order.erase(std::remove(st_.wave_order.begin(), st_.wave_order.end(), it->first),
                                 st_.wave_order.end());
            it = st_.wave_nodes.erase(it);
            continue;
        }
        if (w.phase == "restarting" || w.phase == "ready") {
            w.phase = "rollback_pending";
            w.to = w.from;
            nodes.push_back(it->first);
        } else if (w.phase == "rollback_pending" || w.phase == "rolling_back") {
            nodes.push_back(it->first);  // a rollback under way goes on (an abort during a halt)
        }
        ++it;
    }
    if (st_.history.empty() || st_.history.back().wave != st_.wave || st_.history.back().verdict != why)
        st_.history.push_back({st_.wave, nodes, why, now_ms});
    if (st_.history.size() > kMaxHistory) st_.history.erase(st_.history.begin());
    st_.reason = why;
    st_.after_rollback = after;
    st_.phase = nodes.empty() ? after : "rolling_back";
    st_.settle_from_ms = 0;
    change();
}

void Rollout::finish_wave(int64_t now_ms) {
    std::vector<std::string> nodes;
    for (const auto & name : st_.wave_order) {
        const auto & w = st_.wave_nodes.at(name);
        st_.upgraded[w.from].push_back(name);
        st_.upgraded_cell[name] = w.cell;
        nodes.push_back(name);
    }
    st_.history.push_back({st_.wave, nodes, "passed", now_ms});
    if (st_.history.size() > kMaxHistory) st_.history.erase(st_.history.begin());
    st_.wave_nodes.clear();
    st_.wave_order.clear();
    st_.settle_from_ms = 0;
    change();
}

void Rollout::judge(int64_t now_ms) {
    const GroupSignals & up = wave_sig_;
    const GroupSignals & rest = rest_sig_;
    const GroupSignals & before = st_.before;
    const auto & g = spec_.gates;
    std::vector<GateReading> out;

    // Task success: the share of ended sessions that completed.
    {
        const auto rate = [](const GroupSignals & s) {
            const int64_t n = s.completed + s.failed;
            return n > 0 ? double(s.completed) / double(n) : -1.0;
        };
        GateReading r = reading("task_success", "", rate(up), rate(rest), rate(before));
        double base = 1.0;
        if (r.rest >= 0 || r.before >= 0) base = std::min(r.rest >= 0 ? r.rest : 1.0, r.before >= 0 ? r.before : 1.0);
        r.limit = base - g.success_drop;
        const int64_t decided = up.completed + up.failed;
        r.judged = decided >= g.min_sessions;
        r.fired = r.judged && r.upgraded < r.limit;
        if (!r.judged) r.note = std::to_string(decided) + " of " + std::to_string(g.min_sessions) + " sessions ended";
        out.push_back(r);
    }
    // Mean step latency.
    {
        // Failed model steps are counted in `steps` but carry no time: the mean is over the rest.
        const auto mean = [](const GroupSignals & s) {
            const auto e = s.errors.find("model");
            const int64_t timed = s.steps - (e == s.errors.end() ? 0 : e->second);
            return timed > 0 ? s.step_s / double(timed) : -1.0;
        };
        GateReading r = reading("step_latency", "", mean(up), mean(rest), mean(before));
        const double base = std::max(r.rest, r.before);
        r.limit = base * g.latency_ratio;
        r.judged = up.steps >= g.min_steps && base > 0;
        r.fired = r.judged && r.upgraded > r.limit;
        if (up.steps < g.min_steps)
            r.note = std::to_string(up.steps) + " of " + std::to_string(g.min_steps) + " steps";
        else if (base <= 0)
            r.note = "no steps elsewhere to compare with";
        out.push_back(r);
    }
    // Error codes: each code's count per step.
    {
        std::map<std::string, int> codes;
        for (const auto * s : {&up, &rest, &before})
            for (const auto & [c, n] : s->errors)
                codes[c] += n > 0;
        const auto per_step = [](const GroupSignals & s, const std::string & c) {
            const auto it = s.errors.find(c);
            return it == s.errors.end() ? 0.0 : double(it->second) / double(std::max<int64_t>(1, s.steps));
        };
        const bool judged = up.steps >= g.min_steps;
        const std::string note =
            judged ? "" : std::to_string(up.steps) + " of " + std::to_string(g.min_steps) + " steps";
        if (codes.empty()) out.push_back({"error_codes", "", 0, 0, 0, g.error_floor, judged, false, note});
        for (const auto & [c, unused] : codes) {
            GateReading r = reading("error_codes", c, per_step(up, c), per_step(rest, c), per_step(before, c));
            r.limit = std::max(r.rest, r.before) * g.error_ratio + g.error_floor;
            r.judged = judged;
            r.fired = judged && r.upgraded > r.limit;
            r.note = note;
            out.push_back(r);
        }
    }
    // Heartbeat anomalies per node-minute.
    {
        const auto per_min = [](const GroupSignals & s) {
            return s.node_minutes > 0 ? double(s.heartbeat) / s.node_minutes : 0.0;
        };
        GateReading r = reading("heartbeat", "", per_min(up), per_min(rest), per_min(before));
        r.limit = std::max(r.rest, r.before) + g.heartbeat_excess;
        r.judged = up.node_minutes >= g.min_node_minutes;
        // One late renewal in a short settle is a high rate and no signal: it takes a few.
        r.fired = r.judged && up.heartbeat >= kMinAnomalies && r.upgraded > r.limit;
        if (!r.judged) r.note = num(up.node_minutes) + " of " + num(g.min_node_minutes) + " node-minutes";
        out.push_back(r);
    }

    if (out != st_.gates) {
        st_.gates = out;
        change();
    }
    for (const auto & r : out) {
        if (!r.fired) continue;
        std::string what = r.signal + (r.code.empty() ? "" : " (" + r.code + ")") + " fired: " + num(r.upgraded) +
                           " on the wave vs " + num(r.rest) + " on the rest, " + num(r.before) + " before (limit " +
                           num(r.limit) + ")";
        st_.fired = what;
        halt(what, "halted", now_ms);
        return;
    }
}

std::vector<RestartRequest> Rollout::decide(int64_t now_ms) {
    if (st_.phase == "running" || st_.phase == "paused") {
        if (st_.wave_nodes.empty() && st_.phase == "running") {
            // The fleet is watched for `before_ms` by the brain that runs the rollout before it
            // starts a wave: the wave's gates compare with that. (Later waves have the settle
            // of the one before; a new leader has watched nothing yet and watches first.)
            if (now_ms - born_ms_ < spec_.before_ms) {
                const std::string why = "watching the fleet before wave " + std::to_string(st_.wave + 1);
                if (st_.reason != why) {
                    st_.reason = why;
                    change();
                }
            } else {
                start_wave(now_ms);
            }
        }
        for (const auto & [name, w] : st_.wave_nodes) {
            if (w.phase == "restarting" && now_ms - w.since_ms > spec_.ready_timeout_ms * (1 + w.others)) {
                GateReading r{
                    "ready",
                    "",
                    0,
                    0,
                    0,
                    double(spec_.ready_timeout_ms) / 1000.0,
                    true,
                    true,
                    name + " not back on " + w.to + " within " + std::to_string(spec_.ready_timeout_ms / 1000) + " s"};
                st_.gates = {r};
                st_.fired = "ready fired: " + r.note;
                halt(st_.fired, "halted", now_ms);
                break;
            }
        }
    }
    if (st_.phase == "running") start_restarts(now_ms, "pending", "restarting");
    if ((st_.phase == "running" || st_.phase == "paused") && !st_.wave_nodes.empty()) {
        const bool all_ready = std::all_of(st_.wave_nodes.begin(), st_.wave_nodes.end(),
                                           [](const auto & kv) { return kv.second.phase == "ready"; });
        if (all_ready && st_.settle_from_ms == 0) {
            st_.settle_from_ms = now_ms;
            wave_sig_ = {};
            rest_sig_ = {};
            change();
        } else if (all_ready) {
            judge(now_ms);
            if ((st_.phase == "running" || st_.phase == "paused") && now_ms - st_.settle_from_ms >= spec_.settle_ms)
                finish_wave(now_ms);
        }
    }
    if (st_.phase == "rolling_back") {
        start_restarts(now_ms, "rollback_pending", "rolling_back");
        for (auto & [name, w] : st_.wave_nodes) {
            if (w.phase == "rolling_back" && now_ms - w.since_ms > spec_.ready_timeout_ms * (1 + w.others)) {
                w.phase = "failed";
                st_.reason += "; " + name + " not back on " + w.to + " in time";
                change();
            }
        }
        const bool back = std::all_of(st_.wave_nodes.begin(), st_.wave_nodes.end(), [](const auto & kv) {
            return kv.second.phase == "rolled_back" || kv.second.phase == "failed";
        });
        if (back) {
            st_.phase = st_.after_rollback.empty() ? "halted" : st_.after_rollback;
            change();
        }
    }
    if (changed_) st_.updated_ms = now_ms;

    std::vector<RestartRequest> out;
    if (!rollout_active(st_.phase)) return out;
    for (const auto & name : st_.wave_order) {
        const auto & w = st_.wave_nodes.at(name);
        if (w.phase == "restarting" || w.phase == "rolling_back")
            out.push_back({w.cell, name, w.to, w.gen, w.phase == "rolling_back"});
    }
    return out;
}

}  // namespace armada::cluster

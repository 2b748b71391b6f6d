#include "cluster/global_brain.h"

#include "common/hash.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace armada::cluster {

namespace {

uint64_t fnv1a(const std::string & s) {
    uint64_t h = common::fnv1a64(s);
    // A final mix: FNV's low bits follow the last bytes closely.
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

}  // namespace

CellReport cell_report(const std::string & cell, const std::vector<NodeLoad> & loads,
                       const std::map<std::string, int> & by_tenant, int queued) {
    CellReport r;
    r.cell = cell;
    r.queued = queued;
    double step_sum = 0;
    int step_n = 0;
    for (const auto & l : loads) {
        ++r.nodes;
        r.live_sessions += l.sessions;
        r.cores += l.cores;
        // The cell's step latency: the nodes' recent averages, weighted by the sessions they run
        // (an idle node's last figure still counts, once).
        if (l.step_ms > 0) {
            step_sum += l.step_ms * (l.sessions + 1);
            step_n += l.sessions + 1;
        }
        if (l.draining) continue;
        r.capacity += l.free_seqs + l.sessions;
        r.free_seqs += l.free_seqs;
        r.kv_headroom += l.kv_headroom;
        r.kv_budget += l.kv_budget;
    }
    if (step_n > 0) r.step_ms = step_sum / step_n;
    r.by_tenant = by_tenant;
    return r;
}

std::string pick_cell(const Shares & s, const std::string & tenant) {
    if (auto it = s.tenant_home.find(tenant); it != s.tenant_home.end()) {
        if (auto w = s.weight.find(it->second); w != s.weight.end() && w->second > 0) return it->second;
    }
    // Weighted rendezvous hashing: each cell scores -ln(u)/w with u uniform from (tenant, cell);
    // the lowest wins. A cell wins with probability proportional to its weight, and removing one
    // cell moves only the tenants that were on it.
    std::string best;
    double best_score = 0;
    for (const auto & [cell, w] : s.weight) {
        if (w <= 0) continue;
        const double u = (double(fnv1a(tenant + '\n' + cell) >> 11) + 0.5) / 9007199254740992.0;  // 2^53
        const double score = -std::log(u) / w;
        if (best.empty() || score < best_score) {
            best = cell;
            best_score = score;
        }
    }
    return best;
}

GlobalBrain::GlobalBrain(std::vector<CellSpec> cells, GlobalBrainConfig cfg) : cfg_(cfg) {
    for (auto & c : cells) {
        const std::string name = c.name;
        cells_[name].spec = std::move(c);
    }
}

void GlobalBrain::add_cell(CellSpec spec) {
    const std::string name = spec.name;
    if (!cells_.count(name)) cells_[name].spec = std::move(spec);
}

void GlobalBrain::report(const CellReport & r, int64_t now_ms) {
    auto it = cells_.find(r.cell);
    if (it == cells_.end()) return;  // not in the config: not ours to split load over
    Cell & c = it->second;
    c.last = r;
    c.reported_ms = now_ms;
    c.taken = 0;
    if (c.gone || !c.open.empty()) {
        // Back: what was not handed over yet stays, and its own brain places it again.
        c.gone = false;
        c.open.clear();
    }
}

void GlobalBrain::leases_gone(const std::string & cell) {
    if (auto it = cells_.find(cell); it != cells_.end()) it->second.gone = true;
}

void GlobalBrain::open_in(const std::string & cell, const std::vector<OpenSession> & open) {
    auto it = cells_.find(cell);
    if (it == cells_.end()) return;
    Cell & c = it->second;
    c.open.clear();
    for (const auto & o : open) {
        if (!c.in_flight.count(o.id)) c.open[o.id] = o;
    }
}

void GlobalBrain::rehome_done(const std::string & session) {
    for (auto & [name, c] : cells_)
        c.in_flight.erase(session);
}

void GlobalBrain::node_leases(const std::string & cell, int live) {
    if (auto it = cells_.find(cell); it != cells_.end()) it->second.live_nodes = live;
}

bool GlobalBrain::stale(const std::string & cell, int64_t now_ms) const {
    auto it = cells_.find(cell);
    if (it == cells_.end()) return false;
    const Cell & c = it->second;
    return c.gone || (c.last && now_ms - c.reported_ms > cfg_.report_ttl_ms);
}

bool GlobalBrain::lost(const std::string & cell, int64_t now_ms) const {
    auto it = cells_.find(cell);
    if (it == cells_.end()) return false;
    const Cell & c = it->second;
    if (c.gone) return true;
    // Silent with live nodes: their sessions run on; re-homing them would fence live work.
    return stale(cell, now_ms) && c.live_nodes <= 0;
}

std::vector<std::string> GlobalBrain::lost_cells(int64_t now_ms) const {
    std::vector<std::string> out;
    for (const auto & [name, c] : cells_)
        if (lost(name, now_ms)) out.push_back(name);
    return out;
}

size_t GlobalBrain::waiting() const {
    size_t n = 0;
    for (const auto & [name, c] : cells_)
        n += c.open.size();
    return n;
}

int GlobalBrain::room(const Cell & c, int64_t now_ms) const {
    if (!c.last || stale(c.spec.name, now_ms) || c.last->kv_headroom <= 0) return 0;
    const int limit = int(std::floor(c.spec.water * double(c.last->capacity)));
    // Sessions queued in the cell wait for the same room.
    return std::max(0, limit - c.last->live_sessions - c.last->queued - c.taken);
}

int GlobalBrain::spare(const Cell & c, int64_t now_ms) const {
    if (!c.last || stale(c.spec.name, now_ms) || c.last->kv_headroom <= 0) return 0;
    return std::max(0, c.last->capacity - c.last->live_sessions - c.last->queued - c.taken);
}

Shares GlobalBrain::shares(int64_t now_ms) const {
    Shares s;
    // A cell whose steps are slower than the others' typical one gets less, in proportion (at
    // most 4 times less): it is short of cores, or busier than its counts say.
    std::vector<double> lat;
    for (const auto & [name, c] : cells_)
        if (room(c, now_ms) > 0 && c.last->step_ms > 0) lat.push_back(c.last->step_ms);
    double typical = 0;
    if (!lat.empty()) {
        std::nth_element(lat.begin(), lat.begin() + long(lat.size() / 2), lat.end());
        typical = lat[lat.size() / 2];
    }
    // Likewise a cell with fewer cores per session it can hold than the others' typical cell: its
    // steps will be slow before its latency shows it (at most 4 times less).
    std::vector<double> cps;
    for (const auto & [name, c] : cells_)
        if (room(c, now_ms) > 0 && c.last->cores > 0 && c.last->capacity > 0)
            cps.push_back(double(c.last->cores) / c.last->capacity);
    double typical_cps = 0;
    if (!cps.empty()) {
        std::nth_element(cps.begin(), cps.begin() + long(cps.size() / 2), cps.end());
        typical_cps = cps[cps.size() / 2];
    }
    double sum = 0;
    for (const auto & [name, c] : cells_) {
        const int r = room(c, now_ms);
        if (r <= 0) {
            if (c.last && !stale(name, now_ms)) s.full.insert(name);
            continue;
        }
        double w = double(r);
        if (typical > 0 && c.last->step_ms > typical) w *= std::max(0.25, typical / c.last->step_ms);
        if (typical_cps > 0 && c.last->cores > 0 && c.last->capacity > 0) {
            const double mine = double(c.last->cores) / c.last->capacity;
            if (mine < typical_cps) w *= std::max(0.25, mine / typical_cps);
        }
        s.weight[name] = w;
        sum += w;
    }
    for (auto & [name, w] : s.weight)
        w /= sum;
    // A tenant's home: of the cells under water, the one holding most of its live sessions.
    std::map<std::string, std::pair<int, std::string>> best;  // tenant → (sessions, cell)
    for (const auto & [name, c] : cells_) {
        if (!s.weight.count(name)) continue;
        for (const auto & [tenant, n] : c.last->by_tenant) {
            auto & b = best[tenant];
            if (n > b.first) b = {n, name};
        }
    }
    for (const auto & [tenant, b] : best)
        if (b.first > 0) s.tenant_home[tenant] = b.second;
    return s;
}

std::string GlobalBrain::target(const Cell & from, const std::string & tenant, int64_t now_ms) const {
    // Best first: another fault domain than the lost cell's, then the cell holding most of this
    // tenant's sessions, then the most room.
    std::string best;
    std::tuple<bool, int, int> best_key{false, 0, 0};
    for (const auto & [name, c] : cells_) {
        if (name == from.spec.name) continue;
        const int r = spare(c, now_ms);
        if (r <= 0 || c.tokens < 1) continue;
        const bool other_domain = from.spec.domain.empty() || c.spec.domain != from.spec.domain;
        int mine = 0;
        if (auto t = c.last->by_tenant.find(tenant); t != c.last->by_tenant.end()) mine = t->second;
        const std::tuple<bool, int, int> key{other_domain, mine, r};
        if (best.empty() || key > best_key) {
            best = name;
            best_key = key;
        }
    }
    return best;
}

std::vector<Rehome> GlobalBrain::decide(int64_t now_ms) {
    const double add =
        tokens_at_ms_ < 0 ? 0 : double(std::max<int64_t>(0, now_ms - tokens_at_ms_)) * cfg_.rehomes_per_s / 1000.0;
    for (auto & [name, c] : cells_)
        c.tokens = c.tokens < 0 ? cfg_.burst : std::min(cfg_.burst, c.tokens + add);
    tokens_at_ms_ = now_ms;
    std::vector<Rehome> out;
    for (auto & [name, c] : cells_) {
        if (!lost(name, now_ms)) continue;
        for (auto it = c.open.begin(); it != c.open.end();) {
            const std::string to = target(c, it->second.tenant, now_ms);
            if (to.empty()) return out;  // no room (or no pace) anywhere now: they wait
            out.push_back({it->first, name, to, it->second.epoch + 1});
            cells_[to].taken++;
            cells_[to].tokens -= 1;
            c.in_flight.insert(it->first);
            it = c.open.erase(it);
        }
    }
    return out;
}

}  // namespace armada::cluster

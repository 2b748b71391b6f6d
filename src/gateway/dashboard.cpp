#include "gateway/dashboard.h"

#include "cluster/survival.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

namespace armada::gateway {

using json = nlohmann::json;

namespace {

//! A share in [0, 1], or null when the denominator is not known.
json share(double used, double of) {
    if (!(of > 0) || !std::isfinite(used)) return nullptr;
    return std::clamp(used / of, 0.0, 1.0);
}

json survival_json(const std::map<std::string, int64_t> & ended) {
    if (ended.empty()) return nullptr;  // the cell's brain has not read them yet
    const auto n = [&](const char * k) {
        auto it = ended.find(k);
        return it == ended.end() ? int64_t(0) : it->second;
    };
    json j = {{"completed", n("completed")}, {"failed", n("failed")},       {"timed_out", n("timed_out")},
              {"lost", n("lost")},           {"cancelled", n("cancelled")}, {"ratio", nullptr}};
    const int64_t decided = n("completed") + n("failed") + n("timed_out") + n("lost");
    if (decided > 0) j["ratio"] = double(n("completed")) / double(decided);
    return j;
}

json node_json(const std::string & name, const cluster::NodeLoad & l) {
    return {{"name", name},
            {"sessions", l.sessions},
            {"free_seqs", l.free_seqs},
            {"engines", l.engines},
            {"cores", l.cores},
            {"kv_watermark", share(double(l.kv_budget) - double(l.kv_headroom), double(l.kv_budget))},
            {"kv_budget", l.kv_budget},
            {"draining", l.draining},
            {"step_ms", l.step_ms},
            {"version", l.version},
            {"by_state", l.by_state}};
}

}  // namespace

//! The rollout panel: progress, the wave's nodes, and the gates with the one that fired.
json rollout_json(const DashboardView & v) {
    if (!v.rollout) return nullptr;
    const auto & st = *v.rollout;
    int upgraded = 0;
    for (const auto & [name, n] : v.nodes)
        upgraded += n.load.version == st.version;
    json nodes = json::array();
    for (const auto & name : st.wave_order) {
        const auto it = st.wave_nodes.find(name);
        if (it == st.wave_nodes.end()) continue;
        nodes.push_back({{"name", name},
                         {"cell", it->second.cell},
                         {"from", it->second.from},
                         {"to", it->second.to},
                         {"phase", it->second.phase}});
    }
    json gates = json::array();
    for (const auto & g : st.gates) {
        gates.push_back({{"signal", g.signal},
                         {"code", g.code},
                         {"wave", g.upgraded},
                         {"rest", g.rest},
                         {"before", g.before},
                         {"limit", g.limit},
                         {"judged", g.judged},
                         {"fired", g.fired},
                         {"note", g.note}});
    }
    return {{"id", st.id},
            {"version", st.version},
            {"phase", st.phase},
            {"wave", st.wave},
            {"waves", std::max(st.wave, st.waves)},
            {"upgraded", upgraded},
            {"total", v.nodes.size()},
            {"nodes", std::move(nodes)},
            {"gates", std::move(gates)},
            {"fired", st.fired},
            {"reason", st.reason},
            {"updated_ms", st.updated_ms}};
}

json dashboard_snapshot(const DashboardView & v) {
    std::map<std::string, std::vector<const std::pair<const std::string, NodeView> *>> by_cell;
    for (const auto & kv : v.nodes)
        by_cell[kv.second.cell].push_back(&kv);
    std::set<std::string> cells;
    for (const auto & [c, _] : by_cell)
        cells.insert(c);
    for (const auto & [c, _] : v.reports)
        cells.insert(c);

    json out_cells = json::array(), failovers = json::array();
    std::map<std::string, int64_t> by_state, ended_all;
    int64_t nodes = 0, live = 0, free_seqs = 0, queued = 0;
    for (const auto & c : cells) {
        json nodes_j = json::array();
        std::vector<cluster::NodeLoad> loads;
        for (const auto * kv : by_cell[c]) {
            nodes_j.push_back(node_json(kv->first, kv->second.load));
            loads.push_back(kv->second.load);
            for (const auto & [state, n] : kv->second.load.by_state)
                by_state[state] += n;
        }
        const auto rep = v.reports.find(c);
        const bool reported = rep != v.reports.end();
        const cluster::CellReport r = reported ? rep->second : cluster::cell_report(c, loads, {});
        json cell = {{"name", c},
                     {"reported", reported},
                     {"leader", reported && !r.leader.empty() ? json(r.leader) : json(nullptr)},
                     {"nodes", r.nodes},
                     {"live_sessions", r.live_sessions},
                     {"free_seqs", r.free_seqs},
                     {"queued", r.queued},
                     {"capacity", r.capacity},
                     {"kv_watermark", share(double(r.kv_budget) - double(r.kv_headroom), double(r.kv_budget))},
                     {"step_ms", r.step_ms},
                     {"survival", survival_json(r.ended)},
                     {"weight", nullptr},
                     {"full", v.shares.full.count(c) > 0},
                     {"node_list", std::move(nodes_j)}};
        if (auto w = v.shares.weight.find(c); w != v.shares.weight.end()) cell["weight"] = w->second;
        nodes += r.nodes;
        live += r.live_sessions;
        free_seqs += r.free_seqs;
        queued += r.queued;
        for (const auto & [k, n] : r.ended)
            ended_all[k] += n;
        for (const auto & f : r.failovers)
            failovers.push_back({{"at_ms", f.at_ms}, {"cell", c}, {"node", f.node}, {"sessions", f.sessions}});
        out_cells.push_back(std::move(cell));
    }
    // The latest first, at most a page of them.
    std::sort(failovers.begin(), failovers.end(),
              [](const json & a, const json & b) { return a["at_ms"].get<int64_t>() > b["at_ms"].get<int64_t>(); });
    if (failovers.size() > cluster::CellReport::kMaxFailovers) {
        json keep = json::array();
        for (size_t i = 0; i < cluster::CellReport::kMaxFailovers; ++i)
            keep.push_back(failovers[i]);
        failovers = std::move(keep);
    }
    const bool any_ended =
        std::any_of(v.reports.begin(), v.reports.end(), [](const auto & kv) { return !kv.second.ended.empty(); });
    return {{"at_ms", v.at_ms},
            {"gateway", v.gateway},
            {"gateways", v.gateways},
            {"etcd_ok", v.etcd_ok},
            {"totals",
             {{"cells", cells.size()},
              {"nodes", nodes},
              {"live_sessions", live},
              {"free_seqs", free_seqs},
              {"queued", queued},
              {"by_state", by_state},
              {"survival", any_ended ? survival_json(ended_all) : json(nullptr)}}},
            {"cells", std::move(out_cells)},
            {"failovers", std::move(failovers)},
            {"rollout", rollout_json(v)}};
}

}  // namespace armada::gateway

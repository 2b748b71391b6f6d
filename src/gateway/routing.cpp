#include "gateway/routing.h"

namespace armada::gateway {

std::vector<std::string> most_room(const NodeViews & nodes, const std::string & cell,
                                   const std::set<std::string> & avoid) {
    std::vector<std::string> best;
    int best_free = -1;
    for (const auto & [name, v] : nodes) {
        if (v.load.draining || avoid.count(name) || (!cell.empty() && v.cell != cell)) continue;
        if (v.load.free_seqs > best_free) {
            best.clear();
            best_free = v.load.free_seqs;
        }
        if (v.load.free_seqs == best_free) best.push_back(name);
    }
    return best;
}

std::optional<std::string> chat_route(const NodeViews & nodes, const std::optional<std::string> & bound,
                                      uint64_t & rr) {
    if (bound) {
        auto it = nodes.find(*bound);
        if (it != nodes.end() && !it->second.load.draining && it->second.load.free_seqs > 0) return *bound;
    }
    const auto best = most_room(nodes);
    if (best.empty()) return std::nullopt;
    return best[rr++ % best.size()];
}

}  // namespace armada::gateway

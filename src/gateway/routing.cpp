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

std::string http_route(const std::string & path) {
    // /v1/<collection>/<id>[/<sub>]: the third segment is an id for every collection with ids.
    std::vector<std::string> parts;
    size_t at = 1;
    while (at <= path.size()) {
        const size_t end = std::min(path.find('/', at), path.size());
        parts.push_back(path.substr(at, end - at));
        at = end + 1;
    }
    static const std::set<std::string> with_ids = {"sessions", "agents", "responses", "models"};
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
        const bool id = i == 2 && parts[0] == "v1" && with_ids.count(parts[1]);
        out += "/" + (id ? std::string("{id}") : parts[i]);
    }
    return out.empty() ? "/" : out;
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

#include "cluster/cell_brain.h"

#include <algorithm>
#include <unordered_set>

namespace armada::cluster {

void CellBrain::index(const std::string & id, const Session & s) {
    if (!s.held && !s.confirming && (!live(s.node) || s.evacuate))
        todo_.emplace(s.order, id);
    else
        todo_.erase({s.order, id});
}

void CellBrain::assign(Session & s, const std::string & node) {
    if (s.node == node) return;
    if (!s.node.empty()) {
        auto it = assigned_.find(s.node);
        if (it != assigned_.end() && --it->second <= 0) assigned_.erase(it);
    }
    s.node = node;
    if (!node.empty()) ++assigned_[node];
}

void CellBrain::index_node(const std::string & node) {
    for (const auto & [id, s] : sessions_)
        if (s.node == node) index(id, s);
}

void CellBrain::node_up(const std::string & node) {
    if (nodes_.try_emplace(node).second) index_node(node);
}

void CellBrain::node_down(const std::string & node) {
    if (nodes_.erase(node)) index_node(node);
}

void CellBrain::load(const NodeLoad & l, int64_t now_ms) {
    auto it = nodes_.find(l.node);
    if (it == nodes_.end()) return;  // no lease, no work: a report alone does not make a node live
    Node & n = it->second;
    if (l.seq != 0 && n.load && n.load->seq == l.seq) return;  // read again: nothing new
    n.load = l;
    n.reported_ms = now_ms;
    std::erase_if(n.pending, [&](int64_t at) { return at <= now_ms - cfg_.settle_ms; });
}

void CellBrain::node_draining(const std::string & node) {
    auto it = nodes_.find(node);
    if (it != nodes_.end() && it->second.load) it->second.load->draining = true;
}

bool CellBrain::draining(const std::string & node) const {
    auto it = nodes_.find(node);
    return it != nodes_.end() && it->second.load && it->second.load->draining;
}

namespace {
double free_share(const NodeLoad & l) {
    return l.kv_budget > 0 ? double(std::max<int64_t>(l.kv_headroom, 0)) / double(l.kv_budget) : 1.0;
}
}  // namespace

double CellBrain::kv_free(const std::string & node) const {
    auto it = nodes_.find(node);
    return it == nodes_.end() || !it->second.load ? 1.0 : free_share(*it->second.load);
}

void CellBrain::session_movable(const std::string & id, const std::string & node, int64_t epoch) {
    Session * found = sessions_.find(id);
    if (!found) return;
    Session & s = *found;
    if (s.node != node || s.epoch != epoch || s.evacuate || !live(node)) return;
    s.evacuate = true;
    index(id, s);
}

void CellBrain::session_open(const std::string & id, const std::string & node, int64_t epoch) {
    auto [found, fresh] = sessions_.try_emplace(id);
    Session & s = *found;
    if (fresh) {
        s.order = ++order_;
        assign(s, node);
        s.epoch = epoch;
    } else if (epoch >= s.epoch) {
        // An older assignment heard late never overrides a newer one.
        if (s.node != node || s.epoch != epoch) s.evacuate = false;
        assign(s, node);
        s.epoch = epoch;
        s.held = false;
        s.confirming = false;
    }
    index(id, s);
}

void CellBrain::session_closed(const std::string & id) {
    if (Session * s = sessions_.find(id)) {
        todo_.erase({s->order, id});
        assign(*s, {});
        sessions_.erase(id);
    }
    placing_from_.erase(id);
}

void CellBrain::place_done(const std::string & id) {
    placing_from_.erase(id);
    if (Session * s = sessions_.find(id)) {
        s->confirming = false;
        index(id, *s);
    }
}

void CellBrain::place_failed(const std::string & id) {
    const auto from = placing_from_.find(id);
    if (Session * s = sessions_.find(id)) {
        // Not written: the store still names where it was (or somewhere newer, which the next
        // reconcile says).
        if (from != placing_from_.end() && s->confirming) assign(*s, from->second);
        s->confirming = false;
        s->held = true;
        index(id, *s);
    }
    if (from != placing_from_.end()) placing_from_.erase(from);
}

void CellBrain::reconcile(const std::set<std::string> & live_nodes, const std::vector<OpenSession> & open) {
    for (auto it = nodes_.begin(); it != nodes_.end();)
        it = live_nodes.count(it->first) ? std::next(it) : nodes_.erase(it);
    for (const auto & n : live_nodes)
        nodes_.try_emplace(n);
    // Updated in place (a cell holds thousands of sessions and this runs every few seconds):
    // what the store shows replaces what was known, and what it no longer shows goes.
    ++generation_;
    for (const auto & o : open) {
        auto [found, fresh] = sessions_.try_emplace(o.id);
        Session & s = *found;
        if (fresh) {
            s.order = ++order_;
            assign(s, o.node);
            s.epoch = o.epoch;
        } else if (!(s.confirming && s.epoch > o.epoch)) {
            // (A decision still being written is newer than what the store showed when read.)
            // An offer to move stands while the session stays where it was offered from.
            if (s.node != o.node || s.epoch != o.epoch) {
                s.evacuate = false;
                assign(s, o.node);
            }
            s.epoch = o.epoch;
            s.held = false;
            s.confirming = false;
        }
        s.seen = generation_;
    }
    todo_.clear();
    std::erase_if(placing_from_, [&](const auto & kv) {
        const Session * s = sessions_.find(kv.first);
        return !s || !s->confirming;
    });
    const std::unordered_set<std::string> up(live_nodes.begin(), live_nodes.end());  // the nodes_ now
    for (size_t i = 0; i < sessions_.size();) {
        auto & [id, s] = sessions_.at(i);
        if (s.seen != generation_) {
            assign(s, {});
            sessions_.erase_at(i);  // the last one moves here: look at i again
            continue;
        }
        if (!s.held && !s.confirming && (!up.count(s.node) || s.evacuate)) todo_.emplace(s.order, id);
        ++i;
    }
}

const std::string * CellBrain::pick(int64_t now_ms, const std::string * from, double min_kv_free) const {
    const std::string * best = nullptr;
    int best_free = 0;
    int64_t best_kv = 0;
    for (const auto & [name, n] : nodes_) {
        if (!n.load || n.load->draining || now_ms - n.reported_ms > cfg_.report_ttl_ms) continue;
        if (from && name == *from) continue;
        if (min_kv_free > 0 && free_share(*n.load) < min_kv_free) continue;
        // Placed here but not in its report yet: the recent placements (the report may predate
        // them), or the ones its report still does not count, whichever are more.
        const auto a = assigned_.find(name);
        const int unseen = a == assigned_.end() ? 0 : std::max(0, a->second - n.load->sessions);
        const int free = n.load->free_seqs - std::max(int(n.pending.size()), unseen);
        if (free <= 0) continue;
        if (!best || free > best_free || (free == best_free && n.load->kv_headroom > best_kv)) {
            best = &name;
            best_free = free;
            best_kv = n.load->kv_headroom;
        }
    }
    return best;
}

std::vector<Place> CellBrain::decide(int64_t now_ms) {
    if (tokens_ < 0) {
        tokens_ = cfg_.burst;
    } else if (now_ms > tokens_at_ms_) {
        tokens_ = std::min(cfg_.burst, tokens_ + double(now_ms - tokens_at_ms_) * cfg_.moves_per_s / 1000.0);
    }
    tokens_at_ms_ = now_ms;

    std::vector<Place> out;
    for (auto it = todo_.begin(); it != todo_.end();) {
        const std::string & id = it->second;
        Session & s = *sessions_.try_emplace(id).first;
        const bool moved = !s.node.empty();
        if (moved && tokens_ < 1) {  // new sessions may still go
            ++it;
            continue;
        }
        // Offered by its live node: it goes elsewhere, and its KV comes along. A rebalance (the
        // node does not drain) goes only to a node with KV room.
        const bool offered = s.evacuate && live(s.node);
        const bool rebalance = offered && !draining(s.node);
        const std::string * n = !offered ? pick(now_ms)
                                : rebalance
                                    ? pick(now_ms, &s.node, std::max(cfg_.kv_room, kv_free(s.node) + cfg_.kv_margin))
                                    : pick(now_ms, &s.node);
        if (!n && rebalance) {  // nowhere better: the offer lapses, and the session stays
            s.evacuate = false;
            it = todo_.erase(it);
            continue;
        }
        if (!n) break;  // no room anywhere: they wait, in order
        std::string from = offered ? s.node : std::string();
        std::string left = moved ? s.node : std::string();
        s.evacuate = false;
        placing_from_[id] = s.node;
        assign(s, *n);
        s.epoch += 1;
        s.confirming = true;
        nodes_[*n].pending.push_back(now_ms);
        if (moved) tokens_ -= 1;
        out.push_back({id, *n, s.epoch, moved, std::move(from), std::move(left)});
        it = todo_.erase(it);
    }
    return out;
}

size_t CellBrain::waiting() const {
    size_t n = 0;
    for (const auto & [id, s] : sessions_)
        n += !live(s.node);
    return n;
}

size_t CellBrain::sessions_on(const std::string & node) const {
    size_t n = 0;
    for (const auto & [id, s] : sessions_)
        n += s.node == node;
    return n;
}

std::vector<std::string> CellBrain::live_nodes() const {
    std::vector<std::string> out;
    for (const auto & [name, n] : nodes_)
        out.push_back(name);
    return out;
}

std::vector<NodeLoad> CellBrain::loads(int64_t now_ms) const {
    std::vector<NodeLoad> out;
    for (const auto & [name, n] : nodes_)
        if (n.load && now_ms - n.reported_ms <= cfg_.report_ttl_ms) out.push_back(*n.load);
    return out;
}

std::optional<std::string> CellBrain::node_of(const std::string & session) const {
    const Session * s = sessions_.find(session);
    if (!s) return std::nullopt;
    return s->node;
}

}  // namespace armada::cluster

#include "store/memory_store.h"

#include <algorithm>

namespace armada::store {

namespace {

bool ended(const std::vector<std::string> & states, const std::string & s) {
    return std::find(states.begin(), states.end(), s) != states.end();
}

//! The states that end a session, as the open-rows index has them.
bool ends(const std::string & s) {
    return s == "completed" || s == "failed" || s == "cancelled";
}

//! Whether `states` is exactly the set the open-rows index leaves out.
bool standard_ended(const std::vector<std::string> & states) {
    if (states.size() != 3) return false;
    return std::all_of(states.begin(), states.end(), [](const std::string & x) { return ends(x); }) &&
           std::set<std::string>(states.begin(), states.end()).size() == 3;
}

}  // namespace

void MemoryStore::unindex(const SessionRecord & r) {
    if (ends(r.state)) {
        if (auto c = ended_.find(r.cell); c != ended_.end()) {
            c->second.erase({r.updated_ms, r.id});
            if (c->second.empty()) ended_.erase(c);
        }
        return;
    }
    auto c = open_.find(r.cell);
    if (c == open_.end()) return;
    if (auto n = c->second.find(r.node); n != c->second.end()) {
        n->second.erase(r.id);
        if (n->second.empty()) c->second.erase(n);
    }
    if (c->second.empty()) open_.erase(c);
}

void MemoryStore::index(const SessionRecord & r) {
    if (ends(r.state))
        ended_[r.cell].insert({r.updated_ms, r.id});
    else
        open_[r.cell][r.node].insert(r.id);
}

void MemoryStore::set_down(bool down) {
    std::lock_guard lk(mu_);
    down_ = down;
}

std::optional<SessionRecord> MemoryStore::peek(const std::string & id) const {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return std::nullopt;
    return it->second;
}

bool MemoryStore::down() const {
    std::lock_guard lk(mu_);
    return down_;
}

MemoryStore::Counts MemoryStore::counts() const {
    std::lock_guard lk(mu_);
    return counts_;
}

void MemoryStore::commit(Batch batch, std::function<void(Status)> done) {
    Status st;
    {
        std::lock_guard lk(mu_);
        st = down_ ? Status::Error(kDown) : apply(batch);
        ++counts_.commits;
        if (!st.ok) ++counts_.refused;
    }
    if (done) done(st);
}

Status MemoryStore::apply(const Batch & b) {
    // Every check first: a refused batch writes nothing.
    if (b.leader.rev > 0) {
        auto it = leaders_.find(b.leader.election);
        if (it != leaders_.end() && it->second > b.leader.rev) return Status::Deposed(leader_fenced(b.leader));
    }
    for (const auto & f : b.fences) {
        auto it = sessions_.find(f.session_id);
        if (it == sessions_.end() || it->second.node != f.node || it->second.epoch != f.epoch)
            return Status::Fenced("session " + f.session_id + " is no longer held by " + f.node + " at epoch " +
                                  std::to_string(f.epoch));
    }
    std::map<std::string, int64_t> epoch_now;  // as the batch's earlier assignments leave it
    for (const auto & a : b.assign) {
        // A row the same batch creates is at epoch 0.
        auto it = sessions_.find(a.session_id);
        const bool created = std::any_of(b.sessions.begin(), b.sessions.end(),
                                         [&](const SessionRecord & r) { return r.id == a.session_id; });
        auto [e, first] = epoch_now.try_emplace(a.session_id, it != sessions_.end() ? it->second.epoch : 0);
        const int64_t have = e->second;
        e->second = std::max(have, a.epoch);
        if ((it == sessions_.end() && !created) || have >= a.epoch)
            return Status::Fenced("session " + a.session_id + " is missing or already at epoch " +
                                  std::to_string(a.epoch));
    }
    // A step at an index already written: the same one again is harmless (a retried commit whose
    // answer was lost); a different one would fork the transcript and is refused.
    std::vector<const StepRecord *> fresh_steps;
    for (const auto & s : b.steps) {
        const StepRecord * have = nullptr;
        if (auto it = steps_.find(s.session_id); it != steps_.end())
            for (const auto & x : it->second)
                if (x.seq == s.seq) have = &x;
        if (!have) {
            fresh_steps.push_back(&s);
            continue;
        }
        if (have->kind != s.kind || have->payload != s.payload || have->idempotency != s.idempotency)
            return Status::Error("step " + std::to_string(s.seq) + " of session " + s.session_id +
                                 ": the log already holds a different entry there");
    }
    // Then the writes.
    if (b.leader.rev > 0) leaders_[b.leader.election] = b.leader.rev;
    if (b.forget_leaders) leaders_.clear();
    for (const auto & r : b.sessions) {
        auto [it, fresh] = sessions_.try_emplace(r.id, r);
        if (fresh) {
            // As an INSERT: the assignment is written only by `assign`.
            it->second.node.clear();
            it->second.epoch = 0;
            index(it->second);
            continue;
        }
        SessionRecord & have = it->second;
        unindex(have);
        have.state = r.state;
        have.reason = r.reason;
        have.data = r.data;
        have.updated_ms = r.updated_ms;
        index(have);
    }
    for (const auto & a : b.assign) {
        SessionRecord & r = sessions_[a.session_id];
        unindex(r);
        r.node = a.node;
        r.epoch = a.epoch;
        if (!a.cell.empty()) r.cell = a.cell;
        index(r);
    }
    for (const StepRecord * s : fresh_steps) {
        auto & log = steps_[s->session_id];
        log.insert(std::upper_bound(log.begin(), log.end(), s->seq,
                                    [](int64_t seq, const StepRecord & x) { return seq < x.seq; }),
                   *s);
    }
    for (const auto & id : b.erase) {
        if (auto it = sessions_.find(id); it != sessions_.end()) unindex(it->second);
        sessions_.erase(id);
        steps_.erase(id);
    }
    for (const auto & a : b.agents)
        agents_[{a.tenant, a.id}] = a;
    for (const auto & k : b.erase_agents)
        agents_.erase(k);
    for (const auto & r : b.responses)
        responses_[r.id] = r;
    for (const auto & id : b.erase_responses)
        responses_.erase(id);
    return Status::Ok();
}

std::optional<SessionRecord> MemoryStore::session(const std::string & id) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    if (down_) return std::nullopt;
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return std::nullopt;
    ++counts_.rows_scanned;
    return it->second;
}

std::optional<bool> MemoryStore::has_session(const std::string & id) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    if (down_) return std::nullopt;
    return sessions_.count(id) > 0;
}

std::optional<ResponseRecord> MemoryStore::response(const std::string & id) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    auto it = responses_.find(id);
    if (down_ || it == responses_.end()) return std::nullopt;
    return it->second;
}

std::vector<StepRecord> MemoryStore::steps(const std::string & id) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    auto it = steps_.find(id);
    if (down_ || it == steps_.end()) return {};
    counts_.rows_scanned += int64_t(it->second.size());
    return it->second;
}

std::vector<SessionRecord> MemoryStore::sessions_not_in(const std::vector<std::string> & ended_states) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    std::vector<SessionRecord> out;
    if (down_) return out;
    for (const auto & [id, r] : sessions_) {
        ++counts_.rows_scanned;
        if (!ended(ended_states, r.state)) out.push_back(r);
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const auto & a, const auto & b) { return a.created_ms < b.created_ms; });
    return out;
}

std::optional<std::vector<SessionRecord>> MemoryStore::open_sessions(const std::string & cell, const std::string & node,
                                                                     const std::vector<std::string> & ended_states) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    if (down_) return std::nullopt;
    std::vector<const SessionRecord *> rows;
    const auto take = [&](const SessionRecord & r) {
        if (ended(ended_states, r.state) || r.cell != cell || (!node.empty() && r.node != node)) return;
        ++counts_.rows_scanned;  // as through the open-rows index: only the rows it returns
        rows.push_back(&r);
    };
    if (standard_ended(ended_states)) {
        if (auto c = open_.find(cell); c != open_.end()) {
            const auto each = [&](const std::set<std::string> & ids) {
                for (const auto & id : ids)
                    take(sessions_.at(id));
            };
            if (!node.empty()) {
                if (auto n = c->second.find(node); n != c->second.end()) each(n->second);
            } else {
                for (const auto & [n, ids] : c->second)
                    each(ids);
            }
        }
    } else {
        for (const auto & [id, r] : sessions_)
            take(r);
    }
    // Ordered by creation, ties in the order they were found: sorted as pointers, copied once.
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto * a, const auto * b) { return a->created_ms < b->created_ms; });
    std::vector<SessionRecord> out;
    out.reserve(rows.size());
    for (const SessionRecord * r : rows)
        out.push_back(*r);
    return out;
}

std::optional<std::vector<SessionRecord>> MemoryStore::sessions_of(const std::string & owner, const std::string & state,
                                                                   size_t limit) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    if (down_) return std::nullopt;
    std::vector<SessionRecord> out;
    for (const auto & [id, r] : sessions_)
        if (r.owner == owner && r.agent_id.rfind('@', 0) != 0 && (state.empty() || r.state == state)) out.push_back(r);
    std::stable_sort(out.begin(), out.end(), [](const SessionRecord & a, const SessionRecord & b) {
        return a.created_ms != b.created_ms ? a.created_ms > b.created_ms : a.id < b.id;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
}

std::optional<std::vector<AgentRecord>> MemoryStore::agents() {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    if (down_) return std::nullopt;
    std::vector<AgentRecord> out;
    for (const auto & [k, a] : agents_)
        out.push_back(a);
    return out;
}

std::vector<std::string> MemoryStore::expired(const std::vector<std::string> & states, int64_t before_ms,
                                              size_t limit) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    std::vector<std::string> out;
    for (const auto & [id, r] : sessions_)
        if (out.size() < limit && ended(states, r.state) && r.updated_ms < before_ms) out.push_back(id);
    return out;
}

std::vector<std::string> MemoryStore::expired_responses(int64_t before_ms, size_t limit) {
    std::lock_guard lk(mu_);
    std::vector<std::string> out;
    for (const auto & [id, r] : responses_)
        if (out.size() < limit && r.created_ms < before_ms) out.push_back(id);
    return out;
}

std::vector<Store::MinuteCount> MemoryStore::count_since(const std::vector<std::string> & states, int64_t since_ms) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    std::map<std::pair<std::string, int64_t>, int64_t> n;
    for (const auto & [id, r] : sessions_)
        if (ended(states, r.state) && r.updated_ms >= since_ms && r.agent_id.rfind('@', 0) != 0)
            ++n[{r.state, r.updated_ms / 60000}];
    std::vector<MinuteCount> out;
    for (const auto & [k, c] : n)
        out.push_back({k.first, k.second, c});
    return out;
}

std::optional<std::vector<Store::EndedCount>> MemoryStore::ended_since(const std::string & cell, int64_t since_ms) {
    std::lock_guard lk(mu_);
    ++counts_.reads;
    if (down_) return std::nullopt;
    std::map<std::tuple<std::string, std::string, bool, bool>, int64_t> n;
    // Through the index of ended rows by (cell, updated_ms): the window of one cell, or of each.
    const auto scan = [&](const std::set<std::pair<int64_t, std::string>> & rows) {
        for (auto e = rows.lower_bound({since_ms, std::string()}); e != rows.end(); ++e) {
            const SessionRecord & r = sessions_.at(e->second);
            ++counts_.rows_scanned;
            if (r.agent_id.rfind('@', 0) == 0) continue;
            ++n[{r.cell, r.state, r.reason.rfind("deadline", 0) == 0, r.epoch > 1}];
        }
    };
    if (cell.empty()) {
        for (const auto & [c, rows] : ended_)
            scan(rows);
    } else if (auto c = ended_.find(cell); c != ended_.end()) {
        scan(c->second);
    }
    std::vector<EndedCount> out;
    for (const auto & [k, c] : n)
        out.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), c});
    return out;
}

}  // namespace armada::store

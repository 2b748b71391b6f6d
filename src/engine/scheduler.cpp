#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>

namespace armada::engine {

std::optional<SchedPolicy> parse_sched_policy(const std::string & name) {
    if (name == "plas") return SchedPolicy::Plas;
    if (name == "program-fcfs") return SchedPolicy::ProgramFcfs;
    if (name == "fcfs") return SchedPolicy::Fcfs;
    return std::nullopt;
}

const char * sched_policy_name(SchedPolicy p) {
    switch (p) {
        case SchedPolicy::Plas:
            return "plas";
        case SchedPolicy::ProgramFcfs:
            return "program-fcfs";
        case SchedPolicy::Fcfs:
            return "fcfs";
    }
    return "?";
}

Scheduler::Scheduler(SchedPolicy policy, int64_t starve_ms, int64_t forget_ms, size_t max_programs)
    : policy_(policy), starve_ms_(starve_ms), forget_ms_(forget_ms), max_programs_(max_programs) {}

std::string Scheduler::program_key(const std::string & tenant, const std::string & program) {
    // The length first: no choice of tenant and program names makes two pairs one key.
    return std::to_string(tenant.size()) + ":" + tenant + "/" + program;
}

void Scheduler::arrive(const std::string & program, int64_t now_ms) {
    auto [it, fresh] = programs_.try_emplace(program);
    if (fresh) it->second.first_ms = now_ms;
    it->second.last_ms = std::max(it->second.last_ms, now_ms);
}

void Scheduler::charge(const std::string & program, uint64_t tokens, int64_t now_ms) {
    auto [it, fresh] = programs_.try_emplace(program);
    if (fresh) it->second.first_ms = now_ms;
    it->second.service += tokens;
    it->second.last_ms = std::max(it->second.last_ms, now_ms);
}

uint64_t Scheduler::service(const std::string & program) const {
    auto it = programs_.find(program);
    return it == programs_.end() ? 0 : it->second.service;
}

const Scheduler::Program * Scheduler::find(const std::string & program) const {
    auto it = programs_.find(program);
    return it == programs_.end() ? nullptr : &it->second;
}

Scheduler::Rank Scheduler::rank(const std::string & program, int64_t submitted_ms, uint64_t seq, int64_t now_ms) const {
    Rank r;
    r.seq = seq;
    if (starved(submitted_ms, now_ms)) {
        r.starved = 0;  // among the starved, the oldest first
        return r;
    }
    if (policy_ == SchedPolicy::Fcfs) return r;
    const Program * p = find(program);
    r.first_ms = p ? p->first_ms : submitted_ms;
    if (policy_ == SchedPolicy::Plas && p) r.service = p->service;
    return r;
}

std::vector<size_t> Scheduler::order(const std::vector<SchedTicket> & waiting, int64_t now_ms) const {
    std::vector<std::pair<Rank, size_t>> ranked;
    ranked.reserve(waiting.size());
    for (size_t i = 0; i < waiting.size(); ++i)
        ranked.emplace_back(rank(waiting[i], now_ms), i);
    std::sort(ranked.begin(), ranked.end(), [](const auto & a, const auto & b) { return a.first < b.first; });
    std::vector<size_t> idx;
    idx.reserve(ranked.size());
    for (const auto & [r, i] : ranked)
        idx.push_back(i);
    return idx;
}

void KvHold::observe(const std::string & tool, int64_t latency_ms) {
    std::lock_guard lk(mu_);
    if (!seen_.count(tool) && seen_.size() >= opt_.max_tools) seen_.erase(seen_.begin());
    auto & q = seen_[tool];
    q.push_back(std::max<int64_t>(latency_ms, 0));
    while (q.size() > opt_.window)
        q.pop_front();
}

int64_t KvHold::hold_ms(const std::string & tool) const {
    std::vector<int64_t> v;
    {
        std::lock_guard lk(mu_);
        auto it = seen_.find(tool);
        if (it == seen_.end() || it->second.size() < opt_.min_samples) return opt_.default_ms;
        v.assign(it->second.begin(), it->second.end());
    }
    std::sort(v.begin(), v.end());
    const auto k = size_t(std::ceil(opt_.quantile * double(v.size()))) - 1;
    const int64_t q = v[std::min(k, v.size() - 1)];
    if (q > opt_.max_hold_ms) return 0;
    return q + opt_.margin_ms;
}

int64_t KvHold::hold_ms(const std::vector<std::string> & tools) const {
    int64_t longest = 0;
    for (const auto & t : tools) {
        const int64_t h = hold_ms(t);
        if (h == 0) return 0;
        longest = std::max(longest, h);
    }
    return longest;
}

}  // namespace armada::engine

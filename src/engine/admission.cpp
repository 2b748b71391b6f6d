// Admission: which waiting request gets which sequence, in the scheduling policy's order, and
// what a new request reuses (a parked session, a cached prefix).

#include "engine/engine_parts.h"

#include "common/clock.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace armada::engine {

using detail::Clock;

int Engine::pick_slot(const GenRequest & req) const {
    // A session goes back to the sequence that still holds its KV. Otherwise prefer, in order:
    // a sequence nobody owns (no parking needed), then one whose owner is already parked, then
    // the owner idle longest. Among anonymous sequences, the longest common prefix wins, so a
    // follow-up chat turn reuses its cells; ties go to the least recently used.
    int best = -1;
    int best_cost = 0;
    size_t best_lcp = 0;
    uint64_t best_used = 0;
    Clock::time_point best_hold{};
    for (const auto & s : slots_) {
        if (s.state != SlotState::Idle) continue;
        if (!req.session.empty() && s.owner == req.session) return s.id;
        // A sequence held for its owner's tool call is taken last, the one due soonest first.
        const int cost = s.owner.empty() ? 0 : s.pooled ? 1 : s.held ? 3 : 2;
        const size_t lcp = s.owner.empty() && s.scope == req.tenant ? common_prefix(s.cache, req.prompt) : 0;
        const bool tie_better =
            cost == 3 ? s.hold_until < best_hold : lcp > best_lcp || (lcp == best_lcp && s.last_used < best_used);
        const bool better = best < 0 || cost < best_cost || (cost == best_cost && tie_better);
        if (better) {
            best = s.id;
            best_cost = cost;
            best_lcp = lcp;
            best_used = s.last_used;
            best_hold = s.hold_until;
        }
    }
    return best;
}

void Engine::resolve_program(GenRequest & r) {
    r.seq = ++arrivals_;
    r.arrived_ms = std::chrono::duration_cast<std::chrono::milliseconds>(r.submitted.time_since_epoch()).count();
    std::string key;
    if (!r.program.empty()) {
        key = Scheduler::program_key(r.tenant, r.program);
    } else if (!r.session.empty()) {
        key = Scheduler::program_key(r.tenant, "session:" + r.session);
    } else {
        // A conversation that names no program is known by the chain its prompt extends: a
        // finished call's KV, in a sequence or in a prompt-cache entry, whose whole prompt this
        // prompt repeats, and almost all of its answer (a re-rendered answer may end a few tokens
        // differently). Another conversation with the same system prompt differs within the
        // previous call's prompt, however short its answers.
        constexpr size_t kSlack = 16;
        auto extends = [&](size_t common, size_t prompt_len, size_t held) {
            return held >= PrefixCache::kBlock && common >= prompt_len && common + kSlack >= held;
        };
        for (const auto & s : slots_) {
            if (s.program_done && s.owner.empty() && s.scope == r.tenant &&
                extends(common_prefix(s.cache, r.prompt), s.program_prompt, s.cache.size())) {
                key = s.program;
                break;
            }
        }
        if (key.empty() && cache_) {
            if (auto m = cache_->longest(r.tenant, r.prompt)) {
                auto it = entry_program_.find(m->key);
                if (it != entry_program_.end() && extends(m->common, it->second.second, m->n_tokens))
                    key = it->second.first;
            }
        }
        if (key.empty()) key = Scheduler::program_key(r.tenant, "chain:" + std::to_string(++chains_));
    }
    r.program_key = std::move(key);
    sched_.arrive(r.program_key, r.arrived_ms);
    stats_.programs.store(int64_t(sched_.programs()));
}

void Engine::order_waiting(std::deque<std::unique_ptr<GenRequest>> & waiting) const {
    // FCFS keeps arrival order, which is the deque's; starved requests are the oldest anyway.
    if (sched_.policy() == SchedPolicy::Fcfs || waiting.size() < 2) return;
    const int64_t now = common::steady_ms();
    std::vector<std::pair<Scheduler::Rank, size_t>> ranked;
    ranked.reserve(waiting.size());
    for (size_t i = 0; i < waiting.size(); ++i) {
        const GenRequest & r = *waiting[i];
        ranked.emplace_back(sched_.rank(r.program_key, r.arrived_ms, r.seq, now), i);
    }
    // Only the head is admitted now: the free sequences, and room for requests that wait for a
    // prefix another sequence is computing. The rest are ranked again at the next turn.
    const auto idle =
        size_t(std::count_if(slots_.begin(), slots_.end(), [](const Slot & s) { return s.state == SlotState::Idle; }));
    const size_t head = std::min(ranked.size(), idle + 64);
    std::partial_sort(ranked.begin(), ranked.begin() + std::ptrdiff_t(head), ranked.end(),
                      [](const auto & a, const auto & b) { return a.first < b.first; });
    std::deque<std::unique_ptr<GenRequest>> sorted;
    for (const auto & [rank, i] : ranked)
        sorted.push_back(std::move(waiting[i]));
    waiting.swap(sorted);
}

void Engine::expire_programs(const std::deque<std::unique_ptr<GenRequest>> & waiting) {
    const int64_t now = common::steady_ms();
    if (now - expired_at_ms_ < 10000) return;
    expired_at_ms_ = now;
    std::unordered_map<std::string, int> busy;
    for (const auto & r : waiting)
        busy[r->program_key]++;
    for (const auto & s : slots_) {
        if (s.req) busy[s.req->program_key]++;
    }
    sched_.expire(now, [&](const std::string & k) { return busy.count(k) > 0; });
    stats_.programs.store(int64_t(sched_.programs()));
    if (cache_ && entry_program_.size() > 4 * cache_->entries() + 1024) {
        for (auto it = entry_program_.begin(); it != entry_program_.end();) {
            it = cache_->contains(it->first) ? std::next(it) : entry_program_.erase(it);
        }
    }
}

bool Engine::prefix_pending(const GenRequest & r) const {
    // A request whose prompt shares a block or more with one another sequence is computing right
    // now waits for those tokens instead of computing them again (a burst of conversations with
    // one system prompt, or of new sessions of one agent), then copies or restores them.
    if (!cache_ || r.prompt.size() < 2) return false;
    if (!r.session.empty() && (pool_->contains(r.session) || (journal_ && journal_->contains(r.session)))) return false;
    for (const auto & s : slots_) {
        if (!r.session.empty() && s.owner == r.session) return false;
    }
    int live = -1;
    std::optional<PrefixCache::Match> m;
    const size_t have = reusable(r, -1, live, m);
    for (const auto & s : slots_) {
        if (s.state != SlotState::Prompt || s.scope != r.tenant) continue;
        const size_t shared = std::min(common_prefix(s.req->prompt, r.prompt), r.prompt.size() - 1);
        // Waiting costs a step or two; computing the same tokens twice costs more.
        if (shared >= PrefixCache::kBlock && shared > have && s.n_past < shared) return true;
    }
    return false;
}

bool Engine::has_idle() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const Slot & s) { return s.state == SlotState::Idle; });
}

void Engine::admit(std::deque<std::unique_ptr<GenRequest>> & waiting) {
    if (!has_idle()) return;
    order_waiting(waiting);
    const int64_t now_ms = common::steady_ms();
    for (auto it = waiting.begin(); it != waiting.end();) {
        if (!has_idle()) return;
        if (prefix_pending(**it)) {
            ++it;
            continue;
        }
        const int id = pick_slot(**it);
        if (id < 0) return;
        auto req = std::move(*it);
        it = waiting.erase(it);
        if (h_wait_) h_wait_->observe(double(std::max<int64_t>(now_ms - req->arrived_ms, 0)) / 1000.0);
        if (c_starved_ && sched_.policy() != SchedPolicy::Fcfs && sched_.starved(req->arrived_ms, now_ms))
            c_starved_->inc();
        // Counted active before it stops counting as queued: `submit` reads both, and between the
        // two it would see room for one request more than there is (restoring parked KV below
        // can take a while).
        stats_.active++;
        stats_.queued--;
        Slot & s = slots_[size_t(id)];
        if (s.unsaved &&
            (s.scope != req->tenant || !req->session.empty() || common_prefix(s.cache, req->prompt) < s.cache.size()))
            cache_save(s);
        s.unsaved = false;
        s.kv_source.clear();
        s.snap_at = 0;
        const bool same_owner = s.owner == req->session;
        if (s.held) {
            s.held = false;
            if (auto * c = same_owner ? c_hold_kept_ : c_hold_taken_) c->inc();
        }
        if (!same_owner) evict(s);  // an owned sequence is parked and emptied first
        // Another tenant's tokens are never reused, not even a common prefix.
        if (s.scope != req->tenant) {
            if (!s.cache.empty()) {
                llama_memory_seq_rm(llama_get_memory(ctx_), s.id, -1, -1);
                s.cache.clear();
            }
            s.scope = req->tenant;
        }
        if (!same_owner) {
            if (!req->session.empty()) {
                if (cfg_.park) restore(s, req->session, false);
                set_owner(s, req->session);
            }
        } else if (!s.owner.empty()) {
            s.kv_source = "slot";
            if (s.pooled) pool_->erase(s.owner);  // the slot's copy is the live one again
        }
        s.pooled = false;
        prepare_prefix(s, *req);
        start_slot(s, std::move(req));
    }
}

void Engine::start_slot(Slot & s, std::unique_ptr<GenRequest> req) {
    llama_memory_t mem = llama_get_memory(ctx_);
    size_t keep = common_prefix(s.cache, req->prompt);
    if (keep >= req->prompt.size()) keep = req->prompt.size() - 1;  // the last token must be decoded for logits
    if (!llama_memory_seq_rm(mem, s.id, llama_pos(keep), -1)) {
        llama_memory_seq_rm(mem, s.id, -1, -1);
        keep = 0;
    }
    s.cache.resize(keep);
    s.n_past = keep;
    s.n_cached = int32_t(keep);
    if (cache_) {
        // Counted for every request, wherever the reused tokens came from (its own sequence, the
        // cache, or a copy): the rate clients see in usage.prompt_tokens_details.cached_tokens.
        cache_->lookups++;
        if (keep >= PrefixCache::kBlock) {
            cache_->hits++;
            cache_->tokens_saved += keep;
        }
    }
    s.n_decoded = 0;
    s.i_batch = -1;
    s.ttft_s = 0;
    s.text = std::make_unique<TextStream>(req->stop);
    // Prompt tokens feed the penalties' history, as llama-server does.
    if (req->sampler) {
        for (llama_token t : req->prompt)
            common_sampler_accept(req->sampler.get(), t, false);
    }
    s.program = req->program_key;
    s.program_prompt = req->prompt.size();
    s.program_done = false;
    s.held = false;
    s.req = std::move(req);
    s.state = SlotState::Prompt;
    s.last_used = ++tick_;
}

}  // namespace armada::engine

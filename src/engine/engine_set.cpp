#include "engine/engine_set.h"

#include "common/clock.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

namespace armada::engine {

EngineSet::EngineSet(std::vector<std::unique_ptr<Engine>> engines) : owned_(std::move(engines)) {
    if (owned_.empty()) throw std::invalid_argument("an engine set needs at least one engine");
    for (auto & e : owned_)
        engines_.push_back(e.get());
}

EngineSet::EngineSet(Engine & one) : engines_{&one} {}

namespace {

//! KV budget left on one engine: cells in use and parked RAM entries count against it; prompt
//! cache entries do not (they make way for anything). None while the pool is pressured.
uint64_t headroom(const Engine & e) {
    if (e.kv_pressure()) return 0;
    const auto & st = e.stats();
    const auto pool = e.pool().stats();
    const uint64_t used =
        uint64_t(std::max<int64_t>(st.kv_cells_used.load(std::memory_order_relaxed), 0)) * e.kv_bytes_per_cell() +
        (pool.ram_bytes - std::min(pool.ram_bytes, pool.cache_ram_bytes));
    return e.kv_budget() > used ? e.kv_budget() - used : 0;
}

}  // namespace

uint64_t EngineSet::kv_headroom() const {
    uint64_t sum = 0;
    for (const auto * e : engines_)
        sum += headroom(*e);
    return sum;
}

uint64_t EngineSet::kv_budget() const {
    uint64_t sum = 0;
    for (const auto * e : engines_)
        sum += e->kv_budget();
    return sum;
}

size_t EngineSet::route(const std::string & session) const {
    if (engines_.size() == 1) return 0;
    if (!session.empty()) {
        for (size_t i = 0; i < engines_.size(); ++i)
            if (engines_[i]->kv_usage(session)) return i;
    }
    // Not pressured first, then free sequences (negative when requests queue), then free KV.
    auto score = [](const Engine & e) {
        const auto & st = e.stats();
        const int64_t free_seqs = int64_t(e.config().n_seq_max) - st.active.load(std::memory_order_relaxed) -
                                  st.queued.load(std::memory_order_relaxed);
        return std::make_tuple(!e.kv_pressure(), free_seqs, headroom(e));
    };
    size_t best = 0;
    auto best_score = score(*engines_[0]);
    for (size_t i = 1; i < engines_.size(); ++i) {
        auto s = score(*engines_[i]);
        if (s > best_score) {
            best = i;
            best_score = s;
        }
    }
    return best;
}

std::optional<size_t> EngineSet::cached_on(const GenRequest & req) const {
    // A request with no session (chat, completions, Responses) goes back to the engine whose
    // prompt cache holds the longest part of its prompt, unless that engine is out of room.
    if (engines_.size() == 1 || !req.session.empty()) return std::nullopt;
    std::optional<size_t> best;
    size_t best_common = 0;
    for (size_t i = 0; i < engines_.size(); ++i) {
        const auto * c = engines_[i]->prefix_cache();
        if (!c || engines_[i]->kv_pressure() || !engines_[i]->has_room()) continue;
        const auto m = c->longest(req.tenant, req.prompt);
        if (m && m->common > best_common) {
            best = i;
            best_common = m->common;
        }
    }
    return best;
}

SubmitStatus EngineSet::submit(std::unique_ptr<GenRequest> req) {
    const size_t i = cached_on(*req).value_or(route(req->session));
    return engines_[i]->submit(std::move(req));
}

bool EngineSet::has_room(int32_t n) const {
    return std::any_of(engines_.begin(), engines_.end(), [n](const Engine * e) { return e->has_room(n); });
}

void EngineSet::wake() {
    for (auto * e : engines_)
        e->wake();
}

void EngineSet::hold(const std::string & session, int64_t ms) {
    for (auto * e : engines_)
        e->hold(session, ms);
}

void EngineSet::release(const std::string & session, bool drop) {
    for (auto * e : engines_)
        e->release(session, drop);
}

std::optional<KvJournal::SendFile> EngineSet::open_kv(const std::string & session, std::string & why) const {
    why = "this node keeps no KV journal";
    for (auto * e : engines_) {
        if (!e->journal() || !e->journal()->contains(session)) continue;
        return e->journal()->open_for_send(session, why);
    }
    for (auto * e : engines_)
        if (e->journal()) why = "not journaled";
    return std::nullopt;
}

std::pair<std::string, size_t> EngineSet::incoming_kv(const std::string & session) const {
    const size_t i = route(session);
    if (!engines_[i]->journal()) return {{}, i};
    return {engines_[i]->journal()->incoming_path(session), i};
}

std::string EngineSet::install_kv(size_t engine, const std::string & session, const std::string & file) {
    if (engine >= engines_.size()) return "no such engine";
    return engines_[engine]->install_kv(session, file);
}

std::optional<KvUsage> EngineSet::kv_usage(const std::string & session) const {
    for (size_t i = 0; i < engines_.size(); ++i) {
        if (auto u = engines_[i]->kv_usage(session)) {
            u->engine = int(i);
            return u;
        }
    }
    return std::nullopt;
}

bool EngineSet::idle() const {
    return std::all_of(engines_.begin(), engines_.end(),
                       [](const Engine * e) { return e->stats().active.load() == 0 && e->stats().queued.load() == 0; });
}

std::string EngineSet::stalled(int64_t max_ms) const {
    const int64_t now = common::steady_ms();
    for (size_t i = 0; i < engines_.size(); ++i) {
        const int64_t beat = engines_[i]->stats().beat_ms.load();
        if (beat > 0 && now - beat > max_ms)
            return "engine " + std::to_string(i) + " has not turned its loop for " +
                   std::to_string((now - beat) / 1000) + " s";
    }
    return {};
}

bool EngineSet::kv_pressure() const {
    return std::all_of(engines_.begin(), engines_.end(), [](const Engine * e) { return e->kv_pressure(); });
}

void EngineSet::stop() {
    for (auto * e : engines_)
        e->stop();
}

}  // namespace armada::engine

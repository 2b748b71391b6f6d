// Where a session's KV lives: in its sequence, parked in the pool, in its journal on disk, or in
// the prompt cache; saving, restoring, holding across a tool call, and the KV figures.

#include "engine/engine_parts.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <future>

namespace armada::engine {

using detail::Clock;
using detail::seconds_since;

void Engine::set_owner(Slot & s, const std::string & owner) {
    s.owner = owner;
    std::lock_guard lk(owners_mu_);
    owners_[size_t(s.id)] = owner;
}

bool Engine::save_seq(const Slot & s, KvBlob & blob) {
    blob.tokens = s.cache;
    blob.data.resize(llama_state_seq_get_size(ctx_, s.id));
    const size_t n = llama_state_seq_get_data(ctx_, blob.data.data(), blob.data.size(), s.id);
    if (n == 0 || n > blob.data.size()) {
        spdlog::warn("kv: could not save sequence {} of session {}", s.id, s.owner);
        return false;
    }
    blob.data.resize(n);
    return true;
}

void Engine::journal_step(Slot & s) {
    // The step's KV goes to the session's journal; the writer thread appends what is new.
    const auto t0 = Clock::now();
    KvBlob blob;
    if (!save_seq(s, blob)) return;
    journal_->append(s.owner, std::move(blob));
    stats_.journal_saves++;
    stats_.journal_ns += uint64_t(seconds_since(t0) * 1e9);
}

void Engine::park(Slot & s) {
    // Saves the sequence's KV into the pool; the sequence keeps it until the slot is reused.
    s.held = false;
    if (s.owner.empty()) return;
    if (s.cache.empty()) {
        s.pooled = true;  // nothing to save: taking the sequence costs nothing
        return;
    }
    const auto t0 = Clock::now();
    KvBlob blob;
    if (!save_seq(s, blob)) {
        s.idle_since = Clock::now();  // tried again after the idle grace, not at every turn
        return;
    }
    pool_->put(s.owner, std::move(blob), false);
    s.pooled = true;
    stats_.parks++;
    const double took = seconds_since(t0);
    stats_.park_ns += uint64_t(took * 1e9);
    if (h_park_) h_park_->observe(took);
}

void Engine::evict(Slot & s) {
    // The slot goes to someone else: its owner's KV must be in the pool first, and it must not
    // leak into another session's prompt through prefix reuse.
    s.held = false;
    if (!s.owner.empty()) {
        if (cfg_.park && !s.pooled) park(s);
        llama_memory_seq_rm(llama_get_memory(ctx_), s.id, -1, -1);
        s.cache.clear();
        slot_tokens_[size_t(s.id)] = 0;
        set_owner(s, {});
    }
    s.pooled = false;
}

bool Engine::restore(Slot & s, const std::string & key, bool keep) {
    KvTier from = KvTier::Ram;
    std::string why;
    const auto t0 = Clock::now();
    auto blob = pool_->get(key, keep, from, why);
    bool journaled = false;
    if (!blob && why == "not parked" && journal_ && !keep) {
        // Not in RAM or spilled: after a crash, or on another node, the journal may have it.
        blob = journal_->load(key, why);
        journaled = bool(blob);
        if (!blob && why == "not journaled") why = "not parked";
        from = KvTier::Disk;
    }
    if (!blob) {
        if (why != "not parked") {
            stats_.restore_failures++;
            spdlog::warn("kv: cannot restore {}: {}; re-prefilling", key, why);
        }
        return false;
    }
    if (!load_blob(s, std::move(*blob), key)) return false;
    s.kv_source = journaled ? "journal" : from == KvTier::Ram ? "ram" : "disk";
    (journaled ? stats_.restores_journal : from == KvTier::Ram ? stats_.restores_ram : stats_.restores_disk)++;
    const double took = seconds_since(t0);
    stats_.restore_ns += uint64_t(took * 1e9);
    if (h_restore_) h_restore_->observe(took);
    return true;
}

bool Engine::load_blob(Slot & s, KvBlob && blob, const std::string & what) {
    llama_memory_t mem = llama_get_memory(ctx_);
    const bool fits = !blob.tokens.empty() && int32_t(blob.tokens.size()) < n_ctx_seq_;
    const size_t rc = fits ? llama_state_seq_set_data(ctx_, blob.data.data(), blob.data.size(), s.id) : 0;
    // A restore must be checked: the sequence has to hold exactly positions 0..n-1 afterwards.
    const bool ok = rc != 0 && llama_memory_seq_pos_min(mem, s.id) == 0 &&
                    llama_memory_seq_pos_max(mem, s.id) == llama_pos(blob.tokens.size()) - 1;
    if (!ok) {
        stats_.restore_failures++;
        spdlog::warn("kv: restoring {} into sequence {} failed verification (rc={}, {} tokens); re-prefilling", what,
                     s.id, rc, blob.tokens.size());
        llama_memory_seq_rm(mem, s.id, -1, -1);
        s.cache.clear();
        return false;
    }
    s.cache = std::move(blob.tokens);
    return true;
}

size_t Engine::reusable(const GenRequest & req, int exclude, int & live, std::optional<PrefixCache::Match> & m) const {
    live = -1;
    m.reset();
    if (!cache_) return 0;
    size_t best = 0;
    m = cache_->longest(req.tenant, req.prompt);
    if (m && pool_->contains(m->key)) {
        best = m->common;
    } else {
        m.reset();
    }
    for (const auto & o : slots_) {
        if (o.id == exclude || o.scope != req.tenant || o.cache.empty()) continue;
        const size_t c = common_prefix(o.cache, req.prompt);
        if (c > best) {
            best = c;
            live = o.id;
        }
    }
    return best;
}

void Engine::prepare_prefix(Slot & s, const GenRequest & req) {
    if (!cache_ || req.prompt.size() < 2) return;
    // The last prompt token is always decoded (its logits start the answer).
    const size_t usable = req.prompt.size() - 1;
    const size_t have = std::min(common_prefix(s.cache, req.prompt), usable);
    int live = -1;
    std::optional<PrefixCache::Match> m;
    const size_t could = std::min(reusable(req, s.id, live, m), usable);
    // Worth it from one block on: a restore costs a copy of the saved KV, a block's prefill more.
    // Copying KV costs far less per token than computing it, but not nothing: a small gain from
    // a very long entry (or sequence) is computed instead.
    const size_t moved = live >= 0 ? slots_[size_t(live)].cache.size() : m ? m->n_tokens : 0;
    if (could >= have + PrefixCache::kBlock && moved <= 32 * (could - have)) {
        if (live >= 0) {
            // Another sequence holds it (a burst sharing a prompt, or a turn whose slot went to
            // someone else): copy its KV, then the prompt drops what differs.
            KvBlob blob;
            if (save_seq(slots_[size_t(live)], blob) && load_blob(s, std::move(blob), "a copy of a live sequence")) {
                s.kv_source = "copy";
                stats_.prefix_hits++;
                cache_->copied++;
            }
        } else if (m) {
            if (restore(s, m->key, true)) {
                s.kv_source = "prefix";
                stats_.prefix_hits++;
                cache_->restored++;
            } else {
                cache_->erase(m->key);
                pool_->erase(m->key);
            }
        }
    }
    // An agent's shared instructions nobody holds yet: saved as soon as they are computed, so
    // the sessions arriving meanwhile restore them instead of computing them again.
    const size_t p = size_t(std::max(0, req.prefix_len));
    if (p >= PrefixCache::kBlock && p < req.prompt.size() && common_prefix(s.cache, req.prompt) < p) s.snap_at = p;
}

void Engine::cache_save(Slot & s) {
    if (!cache_ || s.cache.size() < PrefixCache::kBlock) return;
    const std::string key = cache_->key_for(s.scope, s.cache);
    if (!cache_->contains(key) || !pool_->contains(key)) {
        KvBlob blob;
        if (!save_seq(s, blob)) return;
        // Indexed first: if the pool has to drop it at once, its callback takes it out again.
        cache_->insert(key, s.scope, s.cache);
        pool_->put(key, std::move(blob), false, true);
        stats_.prefix_saves++;
    }
    if (s.state == SlotState::Idle && s.program_done) entry_program_[key] = {s.program, s.program_prompt};
    // An entry this one extends (the previous turn of the same conversation) is redundant now.
    for (const auto & k : cache_->covered_by(s.scope, s.cache)) {
        pool_->erase(k);
        cache_->erase(k);
    }
}

void Engine::park_idle() {
    if (!cfg_.park) return;
    const auto now = Clock::now();
    for (auto & s : slots_) {
        if (s.state != SlotState::Idle || s.owner.empty() || s.pooled) continue;
        if (!park_due(s.held, s.hold_until, s.idle_since, std::chrono::milliseconds(cfg_.park_grace_ms), now)) continue;
        if (s.held && c_hold_expired_) c_hold_expired_->inc();
        park(s);
    }
}

int Engine::next_park_ms() const {
    if (!cfg_.park) return 1000;
    const auto now = Clock::now();
    auto next = now + std::chrono::milliseconds(1000);
    for (const auto & s : slots_) {
        if (s.state != SlotState::Idle || s.owner.empty() || s.pooled) continue;
        next = std::min(next, s.held ? s.hold_until : s.idle_since + std::chrono::milliseconds(cfg_.park_grace_ms));
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    return int(std::clamp<int64_t>(ms, 10, 1000));
}

void Engine::hold(const std::string & session, int64_t ms) {
    {
        std::lock_guard lk(mu_);
        if (stopping_) return;
        ops_.push_back([this, session, ms] {
            for (auto & s : slots_) {
                if (s.owner != session || s.state != SlotState::Idle || s.pooled) continue;
                if (ms <= 0) {
                    s.held = false;
                    if (c_hold_none_) c_hold_none_->inc();
                    if (cfg_.park) park(s);
                } else {
                    s.held = true;
                    s.hold_until = Clock::now() + std::chrono::milliseconds(ms);
                }
            }
        });
    }
    cv_.notify_one();
}

void Engine::release(const std::string & session, bool drop) {
    {
        std::lock_guard lk(mu_);
        if (stopping_) return;
        ops_.push_back([this, session, drop] {
            for (auto & s : slots_) {
                if (s.owner != session || s.state != SlotState::Idle) continue;
                if (drop) {
                    s.pooled = true;  // nothing to save
                    evict(s);
                } else if (!s.pooled) {
                    park(s);
                }
            }
            if (drop) {
                pool_->erase(session);
                if (journal_) journal_->erase(session);
            } else {
                pool_->set_cold(session, true);
            }
        });
    }
    cv_.notify_one();
}

std::string Engine::install_kv(const std::string & session, const std::string & file) {
    if (!journal_) return "this node keeps no KV journal";
    auto done = std::make_shared<std::promise<std::string>>();
    auto answer = done->get_future();
    auto abandoned = std::make_shared<std::atomic<bool>>(false);  // the caller stopped waiting
    {
        std::lock_guard lk(mu_);
        if (stopping_) return "the engine is stopping";
        ops_.push_back([this, session, file, done, abandoned] {
            if (abandoned->load()) return done->set_value("abandoned");
            for (auto & s : slots_) {
                if (s.owner != session) continue;
                if (s.state != SlotState::Idle) return done->set_value("a request of the session runs here");
                // An older copy of its KV in a slot: gone, so the received one is what loads.
                s.pooled = true;
                evict(s);
            }
            pool_->erase(session);  // a parked copy would be restored before the journal
            done->set_value(journal_->install(session, file));
        });
    }
    cv_.notify_one();
    // The loop runs queued operations at its next turn; one that stops first drops them.
    if (answer.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
        abandoned->store(true);
        return "the engine did not answer within 60 s";
    }
    try {
        return answer.get();
    } catch (const std::future_error &) {
        return "the engine stopped";
    }
}

std::optional<KvUsage> Engine::kv_usage(const std::string & session) const {
    {
        std::lock_guard lk(owners_mu_);
        for (size_t i = 0; i < owners_.size(); ++i) {
            if (owners_[i] == session) {
                const int32_t n = slot_tokens_[i].load();
                return KvUsage{"slot", n, uint64_t(n) * kv_bytes_per_cell_};
            }
        }
    }
    if (!pool_) return std::nullopt;
    auto e = pool_->info(session);
    if (!e && journal_) e = journal_->info(session);
    if (!e) return std::nullopt;
    return KvUsage{e->tier == KvTier::Ram ? "ram" : "disk", int64_t(e->n_tokens), e->stored_bytes};
}

void Engine::update_kv_stats() {
    int64_t cells = 0;
    for (const auto & s : slots_) {
        cells += int64_t(s.cache.size());
        slot_tokens_[size_t(s.id)].store(int32_t(s.cache.size()), std::memory_order_relaxed);
    }
    stats_.kv_cells_used.store(cells);
}

}  // namespace armada::engine

#include "engine/prefix_cache.h"

#include "engine/kv_pool.h"

#include <algorithm>
#include <cstdio>

namespace armada::engine {

namespace {

size_t shared(const Tokens & a, const Tokens & b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i])
        ++i;
    return i;
}

//! How many of the newest entries under one block hash a lookup compares token by token.
constexpr size_t kCandidates = 32;

}  // namespace

uint64_t PrefixCache::seed(const std::string & scope) const {
    const uint64_t h = fnv1a64(salt_.data(), salt_.size());
    const char sep = 0;
    return fnv1a64(scope.data(), scope.size(), fnv1a64(&sep, 1, h));
}

std::vector<uint64_t> PrefixCache::block_hashes(const std::string & scope, const Tokens & t) const {
    std::vector<uint64_t> out;
    out.reserve(t.size() / kBlock);
    uint64_t h = seed(scope);
    for (size_t at = 0; at + kBlock <= t.size(); at += kBlock) {
        h = fnv1a64(t.data() + at, kBlock * sizeof(llama_token), h);
        out.push_back(h);
    }
    return out;
}

std::string PrefixCache::key_for(const std::string & scope, const Tokens & t) const {
    const uint64_t h = fnv1a64(t.data(), t.size() * sizeof(llama_token), seed(scope));
    char tail[48];
    snprintf(tail, sizeof tail, "/%016llx-%zu", static_cast<unsigned long long>(h), t.size());
    return kKeyPrefix + scope + tail;
}

std::optional<std::string> PrefixCache::scope_of(const std::string & key) {
    const std::string p = kKeyPrefix;
    if (key.compare(0, p.size(), p) != 0) return std::nullopt;
    const size_t slash = key.rfind('/');
    if (slash == std::string::npos || slash < p.size()) return std::nullopt;
    return key.substr(p.size(), slash - p.size());
}

bool PrefixCache::insert(const std::string & key, const std::string & scope, Tokens tokens) {
    if (tokens.size() < kBlock) return false;
    std::lock_guard lk(mu_);
    erase_locked(key);
    Entry e;
    e.scope = scope;
    e.hashes = block_hashes(scope, tokens);
    e.tokens = std::move(tokens);
    e.seq = ++seq_;
    for (uint64_t h : e.hashes)
        by_block_[h].push_back(key);
    entries_.emplace(key, std::move(e));
    inserts++;
    return true;
}

void PrefixCache::erase(const std::string & key) {
    std::lock_guard lk(mu_);
    erase_locked(key);
}

void PrefixCache::erase_locked(const std::string & key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    for (uint64_t h : it->second.hashes) {
        auto b = by_block_.find(h);
        if (b == by_block_.end()) continue;
        auto & v = b->second;
        v.erase(std::remove(v.begin(), v.end(), key), v.end());
        if (v.empty()) by_block_.erase(b);
    }
    entries_.erase(it);
}

bool PrefixCache::contains(const std::string & key) const {
    std::lock_guard lk(mu_);
    return entries_.count(key) > 0;
}

size_t PrefixCache::entries() const {
    std::lock_guard lk(mu_);
    return entries_.size();
}

std::optional<PrefixCache::Match> PrefixCache::longest(const std::string & scope, const Tokens & prompt) const {
    const auto hs = block_hashes(scope, prompt);
    std::lock_guard lk(mu_);
    for (size_t i = hs.size(); i-- > 0;) {
        auto b = by_block_.find(hs[i]);
        if (b == by_block_.end()) continue;
        const Entry * best = nullptr;
        const std::string * best_key = nullptr;
        size_t best_common = 0;
        size_t seen = 0;
        for (auto k = b->second.rbegin(); k != b->second.rend() && seen < kCandidates; ++k, ++seen) {
            const auto e = entries_.find(*k);
            if (e == entries_.end() || e->second.scope != scope) continue;
            // The tokens decide: a hash collision, or another scope, shares nothing.
            const size_t c = shared(e->second.tokens, prompt);
            if (c < (i + 1) * kBlock) continue;
            if (!best || c > best_common || (c == best_common && e->second.seq > best->seq)) {
                best = &e->second;
                best_key = &e->first;
                best_common = c;
            }
        }
        if (best) return Match{*best_key, best->tokens.size(), best_common};
    }
    return std::nullopt;
}

std::vector<std::string> PrefixCache::covered_by(const std::string & scope, const Tokens & tokens) const {
    const auto hs = block_hashes(scope, tokens);
    std::vector<std::string> out;
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < hs.size(); ++i) {
        auto b = by_block_.find(hs[i]);
        if (b == by_block_.end()) continue;
        for (const auto & k : b->second) {
            const auto e = entries_.find(k);
            if (e == entries_.end() || e->second.hashes.size() != i + 1 || e->second.scope != scope) continue;
            const Tokens & t = e->second.tokens;
            if (t.size() < tokens.size() && shared(t, tokens) == t.size()) out.push_back(k);
        }
    }
    return out;
}

}  // namespace armada::engine

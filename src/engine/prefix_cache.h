#pragma once

#include "engine/model.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace armada::engine {

//! The index of the prompt-prefix cache: which saved KV entries hold which token prefixes.
//!
//! A prompt is hashed in blocks of `kBlock` tokens, chained: block i's hash covers the scope
//! (tenant and KV fingerprint) and every token of blocks 0..i. Two prompts share block i's hash
//! only when they share everything up to its end, so the deepest block hash a prompt finds in the
//! index names the entries that share the longest block-aligned prefix with it. Entries keep their
//! tokens, so a hash collision can never restore foreign KV: the tokens are compared before use.
//!
//! The KV itself lives in the engine's KvPool under the entry's key; this class holds only
//! metadata. Thread-safe (the engine thread writes; API threads read stats).
class PrefixCache {
  public:
    static constexpr size_t kBlock = 64;
    static constexpr const char * kKeyPrefix = "c/";

    struct Match {
        std::string key;
        size_t n_tokens = 0;  // the entry's length (what a restore moves)
        size_t common = 0;    // tokens it shares with the prompt
    };

    //! `salt`: the KV fingerprint (model file, context settings, cache types, llama.cpp build),
    //! part of every hash, so KV saved under other settings is never found.
    explicit PrefixCache(std::string salt) : salt_(std::move(salt)) {}

    //! Chained hashes of every whole block of `t`, under `scope`.
    std::vector<uint64_t> block_hashes(const std::string & scope, const Tokens & t) const;
    //! The pool key of an entry holding exactly `t` under `scope`: "c/<scope>/<hash of all tokens>".
    std::string key_for(const std::string & scope, const Tokens & t) const;
    //! The scope in a key made by key_for, or nullopt when it is not a cache key.
    static std::optional<std::string> scope_of(const std::string & key);

    //! Records an entry (replacing one with the same key). Entries shorter than a block are not
    //! worth a lookup and are refused (false).
    bool insert(const std::string & key, const std::string & scope, Tokens tokens);
    void erase(const std::string & key);
    bool contains(const std::string & key) const;
    //! The entry sharing the longest prefix with `prompt` under `scope` (at least one whole
    //! block), or nullopt. Among entries that match equally deep, the one sharing most tokens.
    std::optional<Match> longest(const std::string & scope, const Tokens & prompt) const;
    //! Keys of entries whose tokens are a strict prefix of `tokens` (made redundant by it).
    std::vector<std::string> covered_by(const std::string & scope, const Tokens & tokens) const;
    size_t entries() const;

    // Counters for /metrics and GET /v1/cache: requests; requests that reused a block or more of
    // their prompt, wherever it was (their own sequence, an entry, another sequence); prompt
    // tokens they did not compute; entries saved; requests served from an entry (`restored`) or
    // by copying another sequence (`copied`). Evictions are the pool's (cache_evicted).
    std::atomic<uint64_t> lookups{0}, hits{0}, tokens_saved{0}, inserts{0}, restored{0}, copied{0};

  private:
    struct Entry {
        std::string scope;
        Tokens tokens;
        std::vector<uint64_t> hashes;
        uint64_t seq = 0;  // insertion order: newer wins ties
    };
    void erase_locked(const std::string & key);
    uint64_t seed(const std::string & scope) const;

    const std::string salt_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, Entry> entries_;
    std::unordered_map<uint64_t, std::vector<std::string>> by_block_;  // block hash → keys
    uint64_t seq_ = 0;
};

}  // namespace armada::engine

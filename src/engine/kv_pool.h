#pragma once

#include "engine/model.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace armada::engine {

//! Where a parked sequence's KV lives.
enum class KvTier { Ram, Disk };

//! The saved KV of one sequence (`llama_state_seq_get_data`) and the tokens it holds, in order.
struct KvBlob {
    Tokens tokens;
    std::vector<uint8_t> data;
};

struct KvPoolConfig {
    std::string dir;                  // spill directory; empty: no disk tier (entries over the RAM limit are dropped)
    uint64_t ram_limit = 1ull << 30;  // high watermark: above it, entries spill…
    uint64_t ram_low = 768ull << 20;  // …until RAM is down to this low watermark
    uint64_t disk_limit = 16ull << 30;
    std::string fingerprint;  // model, quantisation, context settings, llama.cpp build
    int zstd_level = 1;
    double min_gain = 0.10;       // compress a spilled blob only when it shrinks by at least this much
    int pressure_hold_ms = 5000;  // after a drop, new sessions wait at least this long
    //! True when `key` with exactly these tokens is already safe on disk elsewhere (the session's
    //! KV journal): spilling it then just frees the RAM, with no write.
    std::function<bool(const std::string & key, const Tokens & tokens)> durable;
    //! Called (under the pool's lock: do not call back into the pool) for every entry that leaves
    //! without being asked to: dropped for room, or found bad when read.
    std::function<void(const std::string & key)> dropped;
    //! Called by `open` for each file found, with its key, fingerprint and tokens (empty when they
    //! cannot be read). Returning Remove deletes the file; Cache keeps it as a prompt-cache entry.
    enum class Found { Keep, Cache, Remove };
    std::function<Found(const std::string & key, const std::string & fingerprint, const Tokens & tokens)> found;
    //! Spill files are compressed and written by the pool's own writer thread, so the engine
    //! thread that parks or saves is not held up by the disk. Off: written by the caller.
    bool background_writes = true;
    //! Test hook: called on the writer thread before each file is written.
    std::function<void(const std::string & key)> before_write;
    //! The clock the pressure hold is measured on (tests step a fake one).
    std::function<std::chrono::steady_clock::time_point()> now = [] { return std::chrono::steady_clock::now(); };
};

//! What is known about one parked entry.
struct KvEntryInfo {
    KvTier tier = KvTier::Ram;
    size_t n_tokens = 0;
    uint64_t raw_bytes = 0;     // size of the llama.cpp state
    uint64_t stored_bytes = 0;  // bytes it takes where it lives (compressed on disk when that paid off)
};

//! Counters for metrics and benchmarks.
struct KvPoolStats {
    uint64_t ram_bytes = 0, disk_bytes = 0;
    size_t ram_entries = 0, disk_entries = 0;
    uint64_t spilled = 0, dropped = 0, compressed = 0, stored_raw = 0, rejected = 0;
    uint64_t released = 0;  // spilled by freeing RAM only: the journal already held them
    // Prompt-cache entries (see prefix_cache.h), also counted in the totals above. They make way
    // before any session's KV and are dropped without pressure: losing one costs a prefill only.
    uint64_t cache_ram_bytes = 0, cache_disk_bytes = 0;
    size_t cache_ram_entries = 0, cache_disk_entries = 0;
    uint64_t cache_evicted = 0;
    // Entries chosen to spill whose file the writer has not finished yet (still in RAM, and
    // counted there).
    size_t writing_entries = 0;
    uint64_t writing_bytes = 0;
};

//! Host-RAM pool of parked KV, spilling to files when over its RAM limit.
//!
//! Entries are keyed by a session id or a shared-prefix key. Spilling picks, in order, entries
//! marked cold (a session waiting for its user, or ended) and then the least recently used, so
//! sessions expected back soon (waiting on a tool) stay in RAM longest. A spilled file carries
//! the key, the tokens, a checksum and the fingerprint; a file whose fingerprint differs from the
//! running engine's, or whose checksum fails, is never loaded: the caller re-prefills instead.
//!
//! Writing a spill file (compressing it, the disk) happens on the pool's writer thread: an entry
//! chosen to spill stays readable in RAM until its file is in place. A `put` that finds RAM over
//! the high watermark while files are still being written waits for them, so RAM never stays
//! above the limit because the disk is slow.
//!
//! Thread-safe: the engine thread parks and restores; API threads read `info` and `stats`.
class KvPool {
  public:
    explicit KvPool(KvPoolConfig cfg);
    ~KvPool();
    KvPool(const KvPool &) = delete;
    KvPool & operator=(const KvPool &) = delete;

    //! Creates the directory and indexes the files already in it (a restart finds them there).
    //! Returns an error message.
    std::string open();

    //! Stores or replaces the entry for `key`, then spills whatever the RAM limit requires.
    //! `cache`: a prompt-cache entry, evicted first and without pressure.
    void put(const std::string & key, KvBlob blob, bool cold, bool cache = false);
    //! Returns the entry's blob, from RAM or disk. `keep` leaves the entry in place (a shared
    //! prefix); otherwise the entry leaves the pool. On a miss `why` says whether there was nothing
    //! or what was wrong with what was found (which is then deleted).
    std::optional<KvBlob> get(const std::string & key, bool keep, KvTier & from, std::string & why);
    bool contains(const std::string & key) const;
    void erase(const std::string & key);
    //! Marks an entry as not expected back soon; spilled first.
    void set_cold(const std::string & key, bool cold);
    //! Moves every RAM entry except prompt-cache entries to disk (clean shutdown). Returns how
    //! many were written.
    size_t spill_all();
    //! Waits until every spill the writer has been given is on disk (or failed).
    void flush();

    std::optional<KvEntryInfo> info(const std::string & key) const;
    KvPoolStats stats() const;
    const KvPoolConfig & config() const { return cfg_; }
    void set_ram_limit(uint64_t high, uint64_t low);
    //! Set when entries had to be dropped (no disk tier, a failed write, or the disk tier at its
    //! limit) or the disk tier passes 90% of its limit; cleared once RAM and disk are back under
    //! their low watermarks and no entry was dropped for `pressure_hold_ms`.
    bool pressured() const;

    //! File format helpers, public for tests and the fuzz target.
    static std::string encode_file(const KvPoolConfig & cfg, const std::string & key, const KvBlob & blob,
                                   bool & compressed);
    //! Parses a file image; fails with a reason on a bad magic, truncation, a foreign
    //! fingerprint, a key mismatch or a bad checksum.
    static std::optional<KvBlob> decode_file(const std::string & image, const std::string & fingerprint,
                                             const std::string & key, std::string & why);

  private:
    struct Entry {
        std::string key;
        KvTier tier = KvTier::Ram;
        std::shared_ptr<KvBlob> blob;  // RAM tier only; shared with the writer while it writes
        size_t n_tokens = 0;
        uint64_t raw_bytes = 0, stored_bytes = 0;
        bool cold = false;
        bool cache = false;
        bool writing = false;  // queued for, or being written by, the writer
        uint64_t used = 0;
        uint64_t gen = 0;  // which put made it: a write finishing for an older one is discarded
    };
    struct WriteJob {
        std::string key;
        uint64_t gen = 0;
    };

    std::string path_for(const std::string & key) const;
    void enforce_locked();
    bool spill_locked(Entry & e);
    void queue_write_locked(Entry & e);
    void writer();
    //! Writes `image` to `key`'s file through a temporary name; false (and nothing left) on failure.
    bool write_file(const std::string & key, const std::string & image) const;
    //! Makes room by losing `e`: a cache entry costs a prefill later, a session's KV raises pressure.
    void evict_locked(Entry & e);
    void remove_locked(std::map<std::string, Entry>::iterator it);
    void count_locked(const Entry & e, int sign);
    void drop_locked(std::map<std::string, Entry>::iterator it);

    KvPoolConfig cfg_;
    mutable std::mutex mu_;
    std::map<std::string, Entry> entries_;
    uint64_t tick_ = 0;
    KvPoolStats stats_;
    bool pressured_ = false;
    std::chrono::steady_clock::time_point last_drop_{};
    std::deque<WriteJob> queue_;  // guarded by mu_
    bool busy_ = false;           // the writer is between taking a job and finishing it
    bool stop_ = false;
    std::condition_variable work_cv_, done_cv_;
    std::thread thread_;  // started by the first background write
};

//! A short, stable description of everything that makes saved KV valid: a sampled hash of the
//! model file with its size, the model's description (architecture, size, quantisation), the
//! context settings and llama.cpp's build. Two engines with the same fingerprint can exchange KV.
std::string kv_fingerprint(const Model & model, int32_t n_ctx_seq, bool kv_unified, const std::string & extra = {});

//! 64-bit FNV-1a, used for file names and checksums (not a cryptographic hash).
uint64_t fnv1a64(const void * data, size_t n, uint64_t h = 0xcbf29ce484222325ull);
//! Reads a whole file into `out`; false when it cannot be read.
bool read_whole_file(const std::string & path, std::string & out);

//! Fast 64-bit checksum over 8-byte words for KV payloads of megabytes (not cryptographic).
uint64_t kv_checksum64(const uint8_t * p, size_t n);

}  // namespace armada::engine

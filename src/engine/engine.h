#pragma once

#include "engine/kv_journal.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "engine/prefix_cache.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/text_stream.h"
#include "obs/metrics.h"

#include <llama.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace armada::engine {

//! Settings of one engine instance; the names follow llama-server's flags.
struct EngineConfig {
    int32_t n_ctx = 4096;     // -c: total KV cells, split evenly across sequences
    int32_t n_seq_max = 4;    // -np: sequences decoded together
    int32_t n_batch = 2048;   // -b: logical batch; raised to n_seq_max + chunk if smaller
    int32_t n_ubatch = 512;   // -ub
    int32_t chunk = 512;      // prompt tokens one sequence may add to one step
    int32_t n_threads = 0;    // -t: 0 = all cores of this machine
    int32_t queue_max = 256;  // requests waiting for a sequence; beyond this, submit refuses
    //! CPUs the compute threads are pinned to, one thread each (see topology.h). Empty: not
    //! pinned. With `n_threads` > 0 as well, the first `n_threads` of them are used.
    std::vector<int> cpus;
    //! NUMA node this engine's memory (KV, compute buffers, parked KV in RAM) is allocated on
    //! first; -1: wherever the allocating thread runs.
    int memory_node = -1;
    //! Position among the node's engines; names the loop thread (`armada-engine`, then
    //! `armada-engine1`, ...).
    int index = 0;
    bool kv_unified = false;
    //! KV cache element types (llama-server's --cache-type-k/-v): f16, or quantized (q8_0, …).
    ggml_type type_k = GGML_TYPE_F16;
    ggml_type type_v = GGML_TYPE_F16;
    bool warmup = true;
    //! Where a grammar allows only one continuation (the fixed parts of a tool call), feed that
    //! text to the model in one batch instead of sampling it token by token ("jump-forward").
    bool jump_forward = true;

    // Session memory (parking). A sequence that belongs to a session keeps its KV between that
    // session's requests; when its slot is wanted by someone else, or it has been idle for
    // `park_grace_ms`, the KV is saved into the pool and restored when the session returns.
    bool park = true;
    int32_t park_grace_ms = 1000;
    //! KV memory of the node: the context's KV plus parked KV in RAM. 0: what the machine or
    //! its cgroup allows, minus the weights and `kv_reserve`. Parked KV spills to disk above 90%
    //! of it, down to 75%.
    uint64_t kv_budget = 0;
    uint64_t kv_reserve = 1ull << 30;
    uint64_t kv_disk_limit = 64ull << 30;  // spill files
    std::string kv_dir;                    // spill directory; empty: no disk tier
    std::string fingerprint_extra;         // appended to the KV fingerprint (tests use it to force a mismatch)
    //! After each step, a session's KV is appended to its journal under `kv_dir`/journal, so a
    //! crash or another node restores it instead of re-prefilling. Needs `park` and `kv_dir`.
    bool kv_journal = true;
    bool kv_journal_sync = false;  // fdatasync each record (survives power loss, not just a crash)
    //! The prompt-prefix cache (prefix_cache.h): a request's KV is kept, by content and tenant,
    //! when it ends, and any later request with the same prefix restores it instead of computing
    //! it again. Lives in the pool with parked KV, under the same budget.
    bool prefix_cache = true;
    //! The order waiting requests get a sequence and prompt chunks a batch (scheduler.h), and
    //! how long a request may wait before it goes ahead of every policy (oldest first).
    //! FCFS by default: on the live workload no program policy measured better (BENCHMARKS.md).
    SchedPolicy sched = SchedPolicy::Fcfs;
    int32_t sched_starve_ms = 10000;
};

//! Where a session's KV is, and how big it is.
struct KvUsage {
    std::string where;  // slot, ram, disk
    int64_t tokens = 0;
    uint64_t bytes = 0;
    int engine = 0;  // which of the node's engines holds it (EngineSet)
};

//! Result of `Engine::submit`.
enum class SubmitStatus { Accepted, QueueFull, Stopped };

//! Counters the API and metrics read from any thread.
struct EngineStats {
    std::atomic<int32_t> active{0};
    std::atomic<int32_t> queued{0};
    std::atomic<uint64_t> requests{0};       // accepted by submit
    std::atomic<uint64_t> forced_tokens{0};  // generated tokens the grammar dictated (jump-forward)
    std::atomic<int64_t> kv_cells_used{0};
    std::atomic<uint64_t> parks{0}, restores_ram{0}, restores_disk{0}, restore_failures{0}, prefix_hits{0},
        prefix_saves{0}, restores_journal{0}, journal_saves{0};
    std::atomic<uint64_t> park_ns{0}, restore_ns{0};  // time spent saving and restoring, in total
    std::atomic<uint64_t> journal_ns{0};              // engine-thread time spent saving state for the journal
    //! common::steady_ms() of the loop's last turn; it turns at least every second while idle (liveness).
    std::atomic<int64_t> beat_ms{0};
    //! Programs (sessions, Responses chains, conversations) the scheduler keeps an account of.
    std::atomic<int64_t> programs{0};
};

//! A KV cache type by llama-server's name (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0,
//! q5_1); nullopt for anything else.
std::optional<ggml_type> parse_cache_type(const std::string & name);

//! One llama_context and the thread that owns it. Every llama.cpp call on the context happens on
//! that thread; other threads only call `submit`, which hands the request over through a locked
//! queue. Each loop iteration packs the next token of every generating sequence plus prompt
//! chunks into one llama_decode (continuous batching).
class Engine {
  public:
    Engine(std::shared_ptr<Model> model, EngineConfig cfg, obs::Registry * metrics);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    //! Creates the context, warms it up and starts the loop thread. Returns an error message.
    std::string start();
    //! Stops the loop; requests still running end with FinishReason::Cancelled.
    void stop();

    //! Thread-safe. On Accepted the sink will see events ending with exactly one Done.
    //! On any other status the request is dropped untouched and its sink never runs.
    SubmitStatus submit(std::unique_ptr<GenRequest> req);
    //! Thread-safe, lock-free and approximate: whether `n` more requests would be accepted now.
    //! Callers check it before costly preparation, so a refusal under overload stays cheap;
    //! `submit` still decides.
    bool has_room(int32_t n = 1) const {
        const int32_t free_seqs = std::max(cfg_.n_seq_max - stats_.active.load(std::memory_order_relaxed), 0);
        return stats_.queued.load(std::memory_order_relaxed) + n <= cfg_.queue_max + free_seqs;
    }
    //! Called on the engine thread when a request ends, with its account and the tokens the
    //! usage (prompt plus generated, as the API reports it). Set before `start`.
    using UsageHook = std::function<void(const std::string & account, int64_t tokens)>;
    void set_usage_hook(UsageHook hook) { usage_hook_ = std::move(hook); }
    //! Wakes the loop, e.g. after a caller set a request's cancel flag.
    void wake();
    //! Thread-safe. The session will not be back soon (`drop` false: spill it first) or at all
    //! (`drop` true: its KV is discarded, in slots, RAM and on disk).
    void release(const std::string & session, bool drop);
    //! Thread-safe; blocks until the engine thread has done it. Takes `file` (a journal received
    //! from another node, see KvJournal::incoming_path) as the session's KV, replacing whatever
    //! this engine held of it. Refused while a request of the session runs here. Returns an
    //! error message.
    std::string install_kv(const std::string & session, const std::string & file);
    //! Thread-safe. The session waits on a tool for about `ms`: its KV stays in its sequence
    //! until then (a sequence is taken from it earlier only when no other is free), and is parked
    //! after. `ms` 0: park it now.
    void hold(const std::string & session, int64_t ms);
    //! Engine thread only (tests read it once the engine is idle): the scheduler's programs.
    const Scheduler & scheduler() const { return sched_; }
    //! Thread-safe. Where the session's KV is and its size; nullopt when the engine holds none.
    std::optional<KvUsage> kv_usage(const std::string & session) const;
    const KvPool & pool() const { return *pool_; }
    //! Null when journaling is off.
    KvJournal * journal() const { return journal_.get(); }
    //! Null when the prompt cache is off.
    const PrefixCache * prefix_cache() const { return cache_.get(); }
    const std::string & fingerprint() const { return fingerprint_; }

    //! Tokens one sequence may hold (prompt + generated).
    int32_t n_ctx_seq() const { return n_ctx_seq_; }
    const EngineConfig & config() const { return cfg_; }
    const EngineStats & stats() const { return stats_; }
    const Model & model() const { return *model_; }
    uint64_t kv_bytes_per_cell() const { return kv_bytes_per_cell_; }
    //! The KV budget in force (resolved from the config at start).
    uint64_t kv_budget() const { return kv_budget_; }
    //! True while parked KV has nowhere to go without being dropped: new sessions should wait.
    bool kv_pressure() const { return pool_ && pool_->pressured(); }

  private:
    enum class SlotState { Idle, Prompt, Generating };
    struct Slot {
        int id = 0;
        SlotState state = SlotState::Idle;
        Tokens cache;  // exactly the tokens held in this sequence's KV cells, in order
        std::unique_ptr<GenRequest> req;
        std::unique_ptr<TextStream> text;
        size_t n_past = 0;  // prompt tokens already in KV
        int32_t n_cached = 0, n_decoded = 0;
        int32_t i_batch = -1;  // logits row in the current batch, -1 when none
        //! Generated tokens not yet in KV: the last sampled one, then any the grammar forced
        //! after it. A step decodes as many as the batch has room for.
        Tokens input;
        uint64_t last_used = 0;
        std::string owner;      // session whose KV this sequence holds; empty: anonymous
        bool pooled = false;    // the pool holds a copy of exactly this KV (eviction is free)
        std::string kv_source;  // where this request's reused KV came from
        std::string scope;      // tenant whose tokens the KV holds; reused only for that tenant
        size_t snap_at = 0;     // save the prompt to the cache once this many tokens are computed
        bool unsaved = false;   // anonymous KV not in the prompt cache yet
        std::chrono::steady_clock::time_point idle_since;
        //! While the owner waits on a tool (Engine::hold): kept in the sequence until this time.
        std::chrono::steady_clock::time_point hold_until;
        bool held = false;
        //! The program of the request that ran here last, and whether it finished (then a request
        //! whose prompt extends this KV is that program's next call).
        std::string program;
        bool program_done = false;
        size_t program_prompt = 0;  // that request's prompt length
        int32_t step_tokens = 0;    // tokens of this sequence in the batch being decoded
        double ttft_s = 0;
        std::chrono::steady_clock::time_point t_last_token;
        std::vector<TokenLogprob> logprobs;  // generated, not yet sent with an event
    };

    void loop();
    void admit(std::deque<std::unique_ptr<GenRequest>> & waiting);
    //! Gives an arriving request its program key, arrival number and time.
    void resolve_program(GenRequest & r);
    //! Puts `waiting` in the policy's order.
    void order_waiting(std::deque<std::unique_ptr<GenRequest>> & waiting) const;
    //! Forgets idle programs (every few seconds).
    void expire_programs(const std::deque<std::unique_ptr<GenRequest>> & waiting);
    //! When the loop must next look at idle sequences to park them (ms from now; 1000 when none).
    int next_park_ms() const;
    int pick_slot(const GenRequest & req) const;
    bool prefix_pending(const GenRequest & r) const;
    bool has_idle() const;
    void park(Slot & s);
    void journal_step(Slot & s);
    bool save_seq(const Slot & s, KvBlob & blob);
    void evict(Slot & s);
    bool restore(Slot & s, const std::string & key, bool keep);
    //! Loads saved KV into the slot's sequence and checks it holds positions 0..n-1.
    bool load_blob(Slot & s, KvBlob && blob, const std::string & what);
    void prepare_prefix(Slot & s, const GenRequest & req);
    //! Tokens of `req`'s prompt some other holder could give it: a cache entry (`m`) or another
    //! sequence's KV (`live`, -1 when none does better than the cache).
    size_t reusable(const GenRequest & req, int exclude, int & live, std::optional<PrefixCache::Match> & m) const;
    //! Keeps the slot's KV as a prompt-cache entry.
    void cache_save(Slot & s);
    void park_idle();
    void set_owner(Slot & s, const std::string & owner);
    void start_slot(Slot & s, std::unique_ptr<GenRequest> req);
    void reap_cancelled(std::deque<std::unique_ptr<GenRequest>> & waiting);
    bool step();
    void sample(Slot & s);
    //! Streams one generated token's text; false when that ended the request.
    bool emit(Slot & s, llama_token t);
    //! The sampled token's log-probability and the best alternatives, from its logits row.
    TokenLogprob logprob(const float * logits, llama_token id, int32_t top) const;
    void finish(Slot & s, FinishReason r, const std::string & error = {});
    void update_kv_stats();
    bool has_active() const;

    std::shared_ptr<Model> model_;
    EngineConfig cfg_;
    obs::Registry * metrics_;
    llama_context * ctx_ = nullptr;
    ggml_threadpool * threadpool_ = nullptr;  // pinned compute threads when cfg_.cpus is set
    llama_batch batch_{};
    int32_t n_ctx_seq_ = 0;
    int32_t n_batch_ = 0;
    uint64_t kv_bytes_per_cell_ = 0;
    uint64_t kv_budget_ = 0;
    uint64_t tick_ = 0;
    std::vector<Slot> slots_;  // engine thread only
    std::unique_ptr<KvPool> pool_;
    std::unique_ptr<KvJournal> journal_;
    std::unique_ptr<PrefixCache> cache_;
    std::string fingerprint_;
    Scheduler sched_;  // engine thread only
    uint64_t arrivals_ = 0, chains_ = 0;
    int64_t expired_at_ms_ = 0;
    //! Prompt-cache entries saved from a finished request: the program that made them, and that
    //! request's prompt length.
    std::unordered_map<std::string, std::pair<std::string, size_t>> entry_program_;
    mutable std::mutex owners_mu_;
    std::vector<std::string> owners_;                      // slot → owner, guarded by owners_mu_
    std::unique_ptr<std::atomic<int32_t>[]> slot_tokens_;  // tokens held per slot, for kv_usage

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<GenRequest>> incoming_;  // guarded by mu_
    UsageHook usage_hook_;
    std::deque<std::function<void()>> ops_;  // guarded by mu_; run on the engine thread
    bool stopping_ = false;                  // guarded by mu_
    std::thread thread_;
    EngineStats stats_;

    obs::Histogram * h_batch_ = nullptr;
    obs::Histogram * h_ttft_ = nullptr;
    obs::Histogram * h_itl_ = nullptr;
    obs::Counter * c_prompt_ = nullptr;
    obs::Counter * c_gen_ = nullptr;
    obs::Counter * c_forced_ = nullptr;
    obs::Counter * c_fallback_ = nullptr;
    obs::Histogram * h_decode_ = nullptr;
    obs::Histogram * h_sample_ = nullptr;
    obs::Histogram * h_park_ = nullptr;
    obs::Histogram * h_restore_ = nullptr;
    obs::Histogram * h_wait_ = nullptr;
    obs::Counter * c_starved_ = nullptr;
    obs::Counter * c_hold_kept_ = nullptr;
    obs::Counter * c_hold_expired_ = nullptr;
    obs::Counter * c_hold_taken_ = nullptr;
    obs::Counter * c_hold_none_ = nullptr;
};

}  // namespace armada::engine

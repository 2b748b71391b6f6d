#pragma once

#include "engine/model.h"
#include "engine/request.h"
#include "engine/text_stream.h"
#include "obs/metrics.h"

#include <llama.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
    bool kv_unified = false;
    bool warmup = true;
};

//! Result of `Engine::submit`.
enum class SubmitStatus { Accepted, QueueFull, Stopped };

//! Counters the API and metrics read from any thread.
struct EngineStats {
    std::atomic<int32_t> active{0};
    std::atomic<int32_t> queued{0};
    std::atomic<int64_t> kv_cells_used{0};
};

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
    //! Wakes the loop, e.g. after a caller set a request's cancel flag.
    void wake();

    //! Tokens one sequence may hold (prompt + generated).
    int32_t n_ctx_seq() const { return n_ctx_seq_; }
    const EngineConfig & config() const { return cfg_; }
    const EngineStats & stats() const { return stats_; }
    const Model & model() const { return *model_; }
    uint64_t kv_bytes_per_cell() const { return kv_bytes_per_cell_; }

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
        llama_token next = LLAMA_TOKEN_NULL;
        uint64_t last_used = 0;
        double ttft_s = 0;
        std::chrono::steady_clock::time_point t_last_token;
    };

    void loop();
    void admit(std::deque<std::unique_ptr<GenRequest>> & waiting);
    int pick_slot(const Tokens & prompt) const;
    void start_slot(Slot & s, std::unique_ptr<GenRequest> req);
    void reap_cancelled(std::deque<std::unique_ptr<GenRequest>> & waiting);
    bool step();
    void sample(Slot & s);
    void finish(Slot & s, FinishReason r, const std::string & error = {});
    void update_kv_stats();
    bool has_active() const;

    std::shared_ptr<Model> model_;
    EngineConfig cfg_;
    obs::Registry * metrics_;
    llama_context * ctx_ = nullptr;
    llama_batch batch_{};
    int32_t n_ctx_seq_ = 0;
    int32_t n_batch_ = 0;
    uint64_t kv_bytes_per_cell_ = 0;
    uint64_t tick_ = 0;
    std::vector<Slot> slots_;  // engine thread only

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<GenRequest>> incoming_;  // guarded by mu_
    bool stopping_ = false;                             // guarded by mu_
    std::thread thread_;
    EngineStats stats_;

    obs::Histogram * h_batch_ = nullptr;
    obs::Histogram * h_ttft_ = nullptr;
    obs::Histogram * h_itl_ = nullptr;
    obs::Counter * c_prompt_ = nullptr;
    obs::Counter * c_gen_ = nullptr;
};

}  // namespace armada::engine

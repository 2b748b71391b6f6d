// The engine: start-up (model, context, threads, warm-up), submit, wake and stop. Its other parts:
// admission.cpp, kv_residency.cpp and engine_loop.cpp (see engine_parts.h).

#include "engine/engine.h"

#include "engine/engine_parts.h"

#include "common/clock.h"
#include "engine/batch_planner.h"
#include "engine/memory_budget.h"
#include "engine/topology.h"

#include <ggml-cpu.h>
#include <pthread.h>
#include <sched.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <future>
#include <thread>

namespace armada::engine {

std::optional<ggml_type> parse_cache_type(const std::string & name) {
    static const std::pair<const char *, ggml_type> types[] = {
        {"f32", GGML_TYPE_F32},       {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
        {"q8_0", GGML_TYPE_Q8_0},     {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
        {"iq4_nl", GGML_TYPE_IQ4_NL}, {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1}};
    for (const auto & [n, t] : types) {
        if (name == n) return t;
    }
    return std::nullopt;
}

const char * finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::Stop:
            return "stop";
        case FinishReason::Length:
            return "length";
        case FinishReason::Cancelled:
            return "cancelled";
        case FinishReason::Error:
            return "error";
    }
    return "error";
}

Engine::Engine(std::shared_ptr<Model> model, EngineConfig cfg, obs::Registry * metrics)
    : model_(std::move(model)), cfg_(cfg), metrics_(metrics), sched_(cfg.sched, cfg.sched_starve_ms) {
    if (metrics_) {
        const obs::Labels policy = {{"policy", sched_policy_name(cfg_.sched)}};
        h_wait_ = &metrics_->histogram("armada_engine_queue_wait_seconds",
                                       "Time from a request's arrival to its sequence, by scheduling policy",
                                       obs::latency_buckets(), policy);
        c_starved_ = &metrics_->counter("armada_engine_starved_admissions_total",
                                        "Requests admitted ahead of the policy's order because they had waited "
                                        "--sched-starve-ms",
                                        policy);
        const std::string hold_help =
            "Sessions' KV held in its sequence across a tool call, by how the hold ended "
            "(kept: the session came back to it; expired: parked when its time was up; "
            "taken: another program needed the sequence; none: parked at once)";
        c_hold_kept_ = &metrics_->counter("armada_kv_holds_total", hold_help, {{"outcome", "kept"}});
        c_hold_expired_ = &metrics_->counter("armada_kv_holds_total", hold_help, {{"outcome", "expired"}});
        c_hold_taken_ = &metrics_->counter("armada_kv_holds_total", hold_help, {{"outcome", "taken"}});
        c_hold_none_ = &metrics_->counter("armada_kv_holds_total", hold_help, {{"outcome", "none"}});
        h_batch_ = &metrics_->histogram("armada_batch_tokens", "Tokens per llama_decode call",
                                        {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048});
        h_decode_ =
            &metrics_->histogram("armada_engine_decode_seconds",
                                 "Time per llama_decode call (one batch through the model)", obs::latency_buckets());
        h_sample_ = &metrics_->histogram("armada_engine_sample_seconds",
                                         "Time after each llama_decode call to sample, stream and save the batch's "
                                         "sequences (engine thread, model idle)",
                                         obs::latency_buckets());
        h_ttft_ =
            &metrics_->histogram("armada_time_to_first_token_seconds",
                                 "Time from request arrival to its first generated token", obs::latency_buckets());
        h_itl_ = &metrics_->histogram("armada_inter_token_seconds", "Time between consecutive generated tokens",
                                      obs::latency_buckets());
        c_prompt_ = &metrics_->counter("armada_prompt_tokens_total", "Prompt tokens evaluated (cache hits excluded)");
        c_gen_ = &metrics_->counter("armada_generated_tokens_total", "Tokens generated");
        c_forced_ = &metrics_->counter("armada_forced_tokens_total",
                                       "Generated tokens a grammar dictated, fed without sampling (jump-forward)");
        c_fallback_ = &metrics_->counter("armada_grammar_fallback_tokens_total",
                                         "Generated tokens whose first choice the grammar refused, so the grammar "
                                         "ran over the candidates (the slow sampling path)");
        h_park_ = &metrics_->histogram("armada_kv_park_seconds", "Time to save one sequence's KV into the pool",
                                       obs::latency_buckets());
        h_restore_ = &metrics_->histogram("armada_kv_restore_seconds", "Time to restore one sequence's KV",
                                          obs::latency_buckets());
    }
}

Engine::~Engine() {
    stop();
    // The pool's writer calls into the journal and the prompt cache: it stops before they go.
    pool_.reset();
    if (batch_.token) llama_batch_free(batch_);
    if (ctx_) llama_free(ctx_);
    if (threadpool_) ggml_threadpool_free(threadpool_);
}

using detail::batch_add;

std::string Engine::start() {
    if (cfg_.n_seq_max < 1 || cfg_.n_seq_max > 256) return "parallel sequences (-np) must be 1..256";
    if (cfg_.n_ctx < 16 * cfg_.n_seq_max) return "context (-c) is too small for the number of sequences";
    if (cfg_.chunk < 1) return "prompt chunk must be at least 1";
    // The context's buffers are first touched on this thread (the clear after the warm-up), and
    // the compute threads started below inherit the policy: all of it lands on the engine's node.
    struct MemoryNode {
        bool on = false;
        ~MemoryNode() {
            if (on) prefer_memory_node(-1);
        }
    } memory_node;
    if (cfg_.memory_node >= 0) {
        // Containers often forbid memory policies (Docker's seccomp profile without
        // CAP_SYS_NICE): the engine then runs with local first-touch allocation.
        if (auto e = prefer_memory_node(cfg_.memory_node); !e.empty())
            spdlog::warn("engine {}: {}; memory follows first touch", cfg_.index, e);
        else
            memory_node.on = true;
    }
    auto cp = llama_context_default_params();
    int32_t threads = cfg_.n_threads > 0 ? cfg_.n_threads : int32_t(std::max(1u, std::thread::hardware_concurrency()));
    if (!cfg_.cpus.empty()) {
        threads = cfg_.n_threads > 0 ? std::min<int32_t>(cfg_.n_threads, int32_t(cfg_.cpus.size()))
                                     : int32_t(cfg_.cpus.size());
    }
    n_batch_ = std::max(cfg_.n_batch, cfg_.n_seq_max + cfg_.chunk);
    cp.n_ctx = uint32_t(cfg_.n_ctx);
    cp.n_batch = uint32_t(n_batch_);
    cp.n_ubatch = uint32_t(std::min(cfg_.n_ubatch, n_batch_));
    cp.n_seq_max = uint32_t(cfg_.n_seq_max);
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.kv_unified = cfg_.kv_unified;
    cp.type_k = cfg_.type_k;
    cp.type_v = cfg_.type_v;
    cp.no_perf = true;
    ctx_ = llama_init_from_model(model_->get(), cp);
    if (!ctx_) {
        return "llama.cpp could not create a context (n_ctx=" + std::to_string(cfg_.n_ctx) + ", cache types " +
               ggml_type_name(cfg_.type_k) + "/" + ggml_type_name(cfg_.type_v) + ")";
    }
    if (!cfg_.cpus.empty()) {
        // One compute thread per listed cpu, each held to its cpu (ggml's strict placement).
        auto tpp = ggml_threadpool_params_default(threads);
        for (size_t i = 0; i < size_t(threads); ++i) {
            const int c = cfg_.cpus[i];
            if (c < 0 || c >= GGML_MAX_N_THREADS) return "cpu " + std::to_string(c) + " cannot be pinned by ggml";
            tpp.cpumask[c] = true;
        }
        tpp.strict_cpu = true;
        threadpool_ = ggml_threadpool_new(&tpp);
        if (!threadpool_) return "cannot start the compute threads on cpus " + format_cpu_list(cfg_.cpus);
        llama_attach_threadpool(ctx_, threadpool_, threadpool_);
    }
    n_ctx_seq_ = int32_t(llama_n_ctx_seq(ctx_));
    batch_ = llama_batch_init(n_batch_, 0, 1);

    // From the context's real cache types and the model's head sizes, not an f16 estimate: the
    // budget, the metrics and every session's memory figures rest on it.
    kv_bytes_per_cell_ = model_->kv_bytes_per_token(cfg_.type_k, cfg_.type_v);

    slots_.resize(size_t(cfg_.n_seq_max));
    for (int i = 0; i < cfg_.n_seq_max; ++i)
        slots_[size_t(i)].id = i;
    owners_.assign(size_t(cfg_.n_seq_max), {});
    slot_tokens_ = std::make_unique<std::atomic<int32_t>[]>(size_t(cfg_.n_seq_max));

    // Saved KV fits only a cache of the same element types.
    std::string extra = cfg_.fingerprint_extra;
    if (cfg_.type_k != GGML_TYPE_F16 || cfg_.type_v != GGML_TYPE_F16)
        extra += std::string("|cache=") + ggml_type_name(cfg_.type_k) + "/" + ggml_type_name(cfg_.type_v);
    fingerprint_ = kv_fingerprint(*model_, n_ctx_seq_, cfg_.kv_unified, extra);
    const uint64_t ctx_kv = kv_bytes_per_cell_ * uint64_t(llama_n_ctx(ctx_));
    kv_budget_ = cfg_.kv_budget;
    if (kv_budget_ == 0) {
        const uint64_t mem = memory_limit();
        const uint64_t used = model_->size_bytes() + cfg_.kv_reserve;
        kv_budget_ = mem > used ? mem - used : 0;
    }
    if (kv_budget_ <= ctx_kv) {
        return "the KV budget (" + format_size(kv_budget_) + ") does not cover the context's own KV (" +
               format_size(ctx_kv) + "); lower -c or raise --kv-budget";
    }
    KvPoolConfig pc;
    pc.dir = cfg_.kv_dir;
    pc.ram_limit = kv_budget_ / 10 * 9 > ctx_kv ? kv_budget_ / 10 * 9 - ctx_kv : 0;
    pc.ram_low = kv_budget_ / 4 * 3 > ctx_kv ? kv_budget_ / 4 * 3 - ctx_kv : 0;
    pc.disk_limit = cfg_.kv_disk_limit;
    pc.fingerprint = fingerprint_;
    if (cfg_.prefix_cache) cache_ = std::make_unique<PrefixCache>(fingerprint_);
    // The pool owns the bytes; the cache's index follows it. Entries from an earlier run are
    // indexed again when they were saved under this very fingerprint, and deleted otherwise.
    pc.dropped = [c = cache_.get()](const std::string & key) {
        if (c) c->erase(key);
    };
    auto foreign = std::make_shared<size_t>(0);
    pc.found = [c = cache_.get(), fp = fingerprint_, foreign](const std::string & key, const std::string & file_fp,
                                                              const Tokens & tokens) {
        const auto scope = PrefixCache::scope_of(key);
        if (!scope) return KvPoolConfig::Found::Keep;
        // With the cache off (a comparison run), its files stay for the next run; they are
        // evicted first if the disk tier needs room.
        if (!c) return KvPoolConfig::Found::Cache;
        if (file_fp != fp) ++*foreign;
        const bool ok =
            file_fp == fp && !tokens.empty() && c->key_for(*scope, tokens) == key && c->insert(key, *scope, tokens);
        return ok ? KvPoolConfig::Found::Cache : KvPoolConfig::Found::Remove;
    };
    if (cfg_.park && cfg_.kv_journal && !cfg_.kv_dir.empty()) {
        KvJournalConfig jc;
        jc.dir = (std::filesystem::path(cfg_.kv_dir) / "journal").string();
        jc.fingerprint = fingerprint_;
        jc.sync = cfg_.kv_journal_sync;
        jc.disk_limit = cfg_.kv_disk_limit;
        // States waiting for the writer are RAM outside the pool: a small part of the budget, but
        // always room for two full sequences (a larger state would never be journaled).
        const uint64_t seq_bytes = kv_bytes_per_cell_ * uint64_t(n_ctx_seq_);
        jc.max_pending_bytes = std::max(std::clamp<uint64_t>(kv_budget_ / 16, 4ull << 20, 256ull << 20), 2 * seq_bytes);
        journal_ = std::make_unique<KvJournal>(jc);
        if (auto e = journal_->open(); !e.empty()) return e;
        // A parked session whose journal is current spills by freeing its RAM: no write.
        pc.durable = [j = journal_.get()](const std::string & key, const Tokens & tokens) {
            return j->holds(key, tokens);
        };
    }
    pool_ = std::make_unique<KvPool>(pc);
    if (auto e = pool_->open(); !e.empty()) return e;
    if (*foreign > 0) {
        spdlog::info(
            "kv: deleted {} prompt-cache files whose fingerprint differs (saved by another model, build or "
            "context setting)",
            *foreign);
    }
    if (cache_ && cache_->entries() > 0) spdlog::info("kv: {} prompt-cache entries found on disk", cache_->entries());
    if (metrics_) {
        metrics_->gauge("armada_kv_bytes_capacity", "KV cache capacity in bytes")
            .set(double(kv_bytes_per_cell_) * double(llama_n_ctx(ctx_)));
    }
    // Every llama_decode runs on the engine thread, the warm-up's too. OpenMP keeps a team of
    // compute threads for each thread that leads one: a decode on the caller's thread would leave
    // a second team whose idle threads take the cores from this one's (measured: decoding on a
    // second thread after one decode on the first ran 7-30% slower, and 2.5x slower with
    // OMP_WAIT_POLICY=active).
    std::promise<std::string> warmed;
    auto warm = warmed.get_future();
    thread_ = std::thread([this, warmed = std::move(warmed)]() mutable {
        std::string e;
        if (cfg_.warmup) {
            // The first decode maps weights and builds graphs; done before taking traffic.
            llama_token t = llama_vocab_bos(model_->vocab());
            if (t == LLAMA_TOKEN_NULL) t = 0;
            batch_.n_tokens = 0;
            batch_add(batch_, t, 0, 0, true);
            if (llama_decode(ctx_, batch_) != 0) e = "warm-up decode failed";
            llama_memory_clear(llama_get_memory(ctx_), true);
            llama_synchronize(ctx_);
        }
        const bool ok = e.empty();
        warmed.set_value(std::move(e));
        if (ok) loop();
    });
    if (auto e = warm.get(); !e.empty()) {
        thread_.join();
        return e;
    }
    return {};
}

void Engine::stop() {
    {
        std::lock_guard lk(mu_);
        if (stopping_) return;
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

SubmitStatus Engine::submit(std::unique_ptr<GenRequest> req) {
    {
        std::lock_guard lk(mu_);
        if (stopping_) return SubmitStatus::Stopped;
        // Free sequences take requests at once; only the excess counts against the queue bound.
        const int32_t free_seqs = cfg_.n_seq_max - stats_.active.load();
        if (stats_.queued.load() >= cfg_.queue_max + std::max(free_seqs, 0)) return SubmitStatus::QueueFull;
        stats_.queued++;
        stats_.requests++;
        incoming_.push_back(std::move(req));
    }
    cv_.notify_one();
    return SubmitStatus::Accepted;
}

void Engine::wake() {
    cv_.notify_one();
}

bool Engine::has_active() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const Slot & s) { return s.state != SlotState::Idle; });
}

}  // namespace armada::engine

#include "engine/engine.h"

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

namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

void batch_add(llama_batch & b, llama_token t, llama_pos pos, llama_seq_id seq, bool logits) {
    const int i = b.n_tokens++;
    b.token[i] = t;
    b.pos[i] = pos;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seq;
    b.logits[i] = logits;
}

}  // namespace

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

void Engine::loop() {
    const std::string name = cfg_.index > 0 ? "armada-engine" + std::to_string(cfg_.index) : "armada-engine";
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    if (!cfg_.cpus.empty()) {
        if (auto e = pin_current_thread(cfg_.cpus); !e.empty()) spdlog::warn("engine: {}", e);
    }
    if (cfg_.memory_node >= 0) prefer_memory_node(cfg_.memory_node);  // start() warned if it fails
    std::deque<std::unique_ptr<GenRequest>> waiting;
    for (;;) {
        std::deque<std::function<void()>> ops;
        const size_t had = waiting.size();
        {
            std::unique_lock lk(mu_);
            auto ready = [&] {
                return stopping_ || !incoming_.empty() || !ops_.empty() || has_active() || !waiting.empty();
            };
            // Idle, the loop still turns once a second: liveness reads its heartbeat.
            cv_.wait_for(lk, std::chrono::milliseconds(next_park_ms()), ready);
            stats_.beat_ms.store(common::steady_ms());
            if (stopping_) break;
            while (!incoming_.empty()) {
                waiting.push_back(std::move(incoming_.front()));
                incoming_.pop_front();
            }
            ops.swap(ops_);
        }
        // Outside the lock: finding a conversation's chain compares its prompt with every
        // sequence, and `submit` should not wait for that.
        for (size_t i = had; i < waiting.size(); ++i)
            resolve_program(*waiting[i]);
        for (auto & op : ops)
            op();
        park_idle();
        // Nothing to compute: the time is free for saving finished requests to the prompt
        // cache, so a later admission does not pay for it.
        if (cache_ && waiting.empty() && !has_active()) {
            for (auto & s : slots_) {
                if (s.unsaved) {
                    cache_save(s);
                    s.unsaved = false;
                }
            }
        }
        reap_cancelled(waiting);
        expire_programs(waiting);
        admit(waiting);
        if (!step() && waiting.empty()) continue;
    }
    // Shutting down: every request still known ends, so no consumer waits forever.
    for (auto & s : slots_) {
        if (s.state != SlotState::Idle) finish(s, FinishReason::Cancelled);
    }
    // Idle sessions' KV goes to disk, so a restart resumes them without re-prefill.
    if (cfg_.park && !cfg_.kv_dir.empty()) {
        for (auto & s : slots_) {
            if (!s.owner.empty() && !s.pooled) park(s);
        }
        const size_t n = pool_->spill_all();
        if (n > 0) spdlog::info("kv: saved {} parked sequences to {}", n, cfg_.kv_dir);
    }
    if (journal_) journal_->flush();
    std::lock_guard lk(mu_);
    for (auto * q : {&waiting, &incoming_}) {
        for (auto & r : *q) {
            GenEvent ev;
            ev.kind = GenEvent::Kind::Done;
            ev.finish = FinishReason::Cancelled;
            r->sink(std::move(ev));
            stats_.queued--;
        }
        q->clear();
    }
}

void Engine::reap_cancelled(std::deque<std::unique_ptr<GenRequest>> & waiting) {
    for (auto & s : slots_) {
        if (s.state != SlotState::Idle && s.req->cancelled->load()) finish(s, FinishReason::Cancelled);
    }
    for (auto it = waiting.begin(); it != waiting.end();) {
        if ((*it)->cancelled->load()) {
            GenEvent ev;
            ev.kind = GenEvent::Kind::Done;
            ev.finish = FinishReason::Cancelled;
            (*it)->sink(std::move(ev));
            stats_.queued--;
            it = waiting.erase(it);
        } else {
            ++it;
        }
    }
}

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

bool Engine::step() {
    batch_.n_tokens = 0;
    int32_t n_gen = 0;
    // Every generating sequence decodes at least one token; forced tokens beyond that share
    // what is left of the batch after one prompt chunk, and any that do not fit go in the next
    // step.
    int32_t spare = n_batch_;
    for (const auto & s : slots_) {
        if (s.state == SlotState::Generating) spare -= 1;
        if (s.state == SlotState::Prompt) spare = std::min(spare, n_batch_ - cfg_.n_seq_max - std::max(cfg_.chunk, 1));
    }
    for (auto & s : slots_) {
        s.i_batch = -1;
        s.step_tokens = 0;
        if (s.state != SlotState::Generating) continue;
        const size_t take = 1 + std::min(s.input.size() - 1, size_t(std::max(0, spare)));
        spare -= int32_t(take - 1);
        const bool all = take == s.input.size();
        for (size_t k = 0; k < take; ++k) {
            const bool logits = all && k + 1 == take;
            if (logits) s.i_batch = batch_.n_tokens;
            batch_add(batch_, s.input[k], llama_pos(s.cache.size()), s.id, logits);
            s.cache.push_back(s.input[k]);
        }
        s.input.erase(s.input.begin(), s.input.begin() + std::ptrdiff_t(take));
        n_gen += int32_t(take);
        s.step_tokens = int32_t(take);
    }
    std::vector<PendingPrompt> prompts;
    for (auto & s : slots_) {
        if (s.state == SlotState::Prompt) {
            // A pending prefix snapshot stops this prompt exactly at the prefix's end.
            const size_t upto = s.snap_at > s.n_past ? s.snap_at : s.req->prompt.size();
            prompts.push_back({s.id, int32_t(upto - s.n_past)});
        }
    }
    // Prompt chunks go in the policy's order; under FCFS, admission order (lower last_used was
    // admitted first).
    if (sched_.policy() == SchedPolicy::Fcfs) {
        std::sort(prompts.begin(), prompts.end(), [&](const PendingPrompt & a, const PendingPrompt & b) {
            return slots_[size_t(a.slot)].last_used < slots_[size_t(b.slot)].last_used;
        });
    } else if (prompts.size() > 1) {
        const int64_t now_ms = common::steady_ms();
        std::vector<std::pair<Scheduler::Rank, PendingPrompt>> ranked;
        ranked.reserve(prompts.size());
        for (const auto & p : prompts) {
            const GenRequest & r = *slots_[size_t(p.slot)].req;
            ranked.emplace_back(sched_.rank(r.program_key, r.arrived_ms, r.seq, now_ms), p);
        }
        std::sort(ranked.begin(), ranked.end(), [](const auto & a, const auto & b) { return a.first < b.first; });
        for (size_t i = 0; i < ranked.size(); ++i)
            prompts[i] = ranked[i].second;
    }
    int64_t n_prompt_tokens = 0;
    for (const auto & c : plan_prompt_chunks(n_batch_, cfg_.chunk, n_gen, prompts)) {
        Slot & s = slots_[size_t(c.slot)];
        for (int32_t k = 0; k < c.n_tokens; ++k) {
            const bool last = s.n_past + 1 == s.req->prompt.size();
            if (last) s.i_batch = batch_.n_tokens;
            batch_add(batch_, s.req->prompt[s.n_past], llama_pos(s.n_past), s.id, last);
            s.cache.push_back(s.req->prompt[s.n_past]);
            ++s.n_past;
        }
        s.step_tokens += c.n_tokens;
        n_prompt_tokens += c.n_tokens;
    }
    if (batch_.n_tokens == 0) return false;

    const auto t_decode = Clock::now();
    const int rc = llama_decode(ctx_, batch_);
    const auto t_decoded = Clock::now();
    if (h_decode_) h_decode_->observe(std::chrono::duration<double>(t_decoded - t_decode).count());
    if (h_batch_) h_batch_->observe(batch_.n_tokens);
    if (c_prompt_) c_prompt_->inc(uint64_t(n_prompt_tokens));
    if (rc != 0) {
        spdlog::error("llama_decode failed with {} for a batch of {} tokens", rc, batch_.n_tokens);
        llama_memory_t mem = llama_get_memory(ctx_);
        for (auto & s : slots_) {
            if (s.state == SlotState::Idle) continue;
            llama_memory_seq_rm(mem, s.id, -1, -1);
            s.cache.clear();
            finish(s, FinishReason::Error,
                   "the model failed to evaluate the batch (llama_decode " + std::to_string(rc) + ")");
        }
        return true;
    }
    // Each program is charged for the tokens computed for it (its attained service).
    const int64_t charged_ms = common::steady_ms();
    for (const auto & s : slots_) {
        if (s.step_tokens > 0 && s.req) sched_.charge(s.req->program_key, uint64_t(s.step_tokens), charged_ms);
    }
    for (auto & s : slots_) {
        if (s.snap_at > 0 && s.state == SlotState::Prompt && s.n_past == s.snap_at) {
            cache_save(s);
            s.snap_at = 0;
        }
        if (s.i_batch < 0) continue;
        if (s.state == SlotState::Prompt) s.state = SlotState::Generating;
        sample(s);
    }
    if (h_sample_) h_sample_->observe(std::chrono::duration<double>(Clock::now() - t_decoded).count());
    update_kv_stats();
    return true;
}

TokenLogprob Engine::logprob(const float * logits, llama_token id, int32_t top) const {
    const int32_t n = model_->n_vocab();
    float mx = logits[0];
    for (int32_t i = 1; i < n; ++i)
        mx = std::max(mx, logits[i]);
    double sum = 0;
    for (int32_t i = 0; i < n; ++i)
        sum += std::exp(double(logits[i] - mx));
    const float norm = mx + float(std::log(sum));
    TokenLogprob lp;
    lp.id = id;
    lp.piece = model_->piece(id, true);
    lp.logprob = logits[id] - norm;
    if (top > 0) {
        std::vector<llama_token> best;
        best.reserve(size_t(top) + 1);
        for (int32_t i = 0; i < n; ++i) {
            if (best.size() == size_t(top) && logits[i] <= logits[best.back()]) continue;
            auto at = std::upper_bound(best.begin(), best.end(), i,
                                       [&](llama_token a, llama_token b) { return logits[a] > logits[b]; });
            best.insert(at, i);
            if (best.size() > size_t(top)) best.pop_back();
        }
        for (llama_token t : best)
            lp.top.emplace_back(model_->piece(t, true), logits[t] - norm);
    }
    return lp;
}

void Engine::sample(Slot & s) {
    GenRequest & r = *s.req;
    llama_token id;
    if (r.fast) {
        id = r.fast->sample(llama_get_logits_ith(ctx_, s.i_batch), model_->n_vocab());
    } else if (r.gfast) {
        const uint64_t fb = r.gfast->fallbacks();
        id = r.gfast->sample(llama_get_logits_ith(ctx_, s.i_batch), model_->n_vocab());
        if (c_fallback_ && r.gfast->fallbacks() != fb) c_fallback_->inc();
        if (!r.gfast->accept(id)) {
            finish(s, FinishReason::Error, "the output grammar reached a state with no allowed token");
            return;
        }
    } else {
        id = common_sampler_sample(r.sampler.get(), ctx_, s.i_batch);
        common_sampler_accept(r.sampler.get(), id, true);
    }
    ++s.n_decoded;
    if (c_gen_) c_gen_->inc();
    const auto now = Clock::now();
    if (s.n_decoded == 1) {
        s.ttft_s = seconds_since(r.submitted);
        if (h_ttft_) h_ttft_->observe(s.ttft_s);
    } else if (h_itl_) {
        h_itl_->observe(std::chrono::duration<double>(now - s.t_last_token).count());
    }
    s.t_last_token = now;

    if (model_->is_eog(id)) {
        finish(s, FinishReason::Stop);
        return;
    }
    if (r.logprobs >= 0) s.logprobs.push_back(logprob(llama_get_logits_ith(ctx_, s.i_batch), id, r.logprobs));
    s.input.assign(1, id);
    if (!emit(s, id)) return;
    // Forced tokens have no logits of their own: a request that wants log-probabilities samples
    // every token.
    if (!r.gfast || !cfg_.jump_forward || r.logprobs >= 0) return;
    // What the grammar allows only one way is not sampled: its tokens go to the model together
    // in the next step, and their text to the caller now. At most what is left of max_tokens.
    const std::string text = r.gfast->forced(256);
    if (text.empty()) return;
    for (llama_token t : model_->tokenize(text, false, true)) {
        ++s.n_decoded;
        stats_.forced_tokens++;
        if (c_gen_) c_gen_->inc();
        if (c_forced_) c_forced_->inc();
        s.input.push_back(t);
        if (!emit(s, t)) return;
    }
}

bool Engine::emit(Slot & s, llama_token t) {
    GenRequest & r = *s.req;
    const bool special =
        r.render_special || std::find(r.special_ok.begin(), r.special_ok.end(), t) != r.special_ok.end();
    std::string out = s.text->push(model_->piece(t, special));
    if (!out.empty() || !s.logprobs.empty()) {
        GenEvent ev;
        ev.text = std::move(out);
        ev.logprobs = std::move(s.logprobs);
        s.logprobs.clear();
        r.sink(std::move(ev));
    }
    if (s.text->stopped()) {
        finish(s, FinishReason::Stop);
        return false;
    }
    if ((r.max_tokens >= 0 && s.n_decoded >= r.max_tokens) || int32_t(s.cache.size() + s.input.size()) >= n_ctx_seq_) {
        // Out of max_tokens, or the sequence's context is full.
        finish(s, FinishReason::Length);
        return false;
    }
    return true;
}

void Engine::finish(Slot & s, FinishReason r, const std::string & error) {
    GenRequest & req = *s.req;
    if (r != FinishReason::Error && r != FinishReason::Cancelled) {
        std::string tail = s.text->finish();
        if (!tail.empty() || !s.logprobs.empty()) {
            GenEvent ev;
            ev.text = std::move(tail);
            ev.logprobs = std::move(s.logprobs);
            req.sink(std::move(ev));
        }
    }
    s.logprobs.clear();
    GenEvent done;
    done.kind = GenEvent::Kind::Done;
    done.finish = r;
    done.error = error;
    done.n_prompt = int32_t(req.prompt.size());
    done.n_cached = s.n_cached;
    done.n_generated = s.n_decoded;
    done.ttft_s = s.ttft_s;
    done.kv_tokens = int32_t(s.cache.size());
    done.kv_source = s.kv_source;
    s.idle_since = Clock::now();
    s.snap_at = 0;
    s.program_done = r != FinishReason::Error;
    if (usage_hook_) usage_hook_(req.account, int64_t(done.n_prompt) + done.n_generated);
    // Free before the caller hears of it, so its next request finds the sequence free.
    stats_.active--;
    req.sink(std::move(done));
    s.req.reset();
    s.text.reset();
    s.input.clear();
    s.state = SlotState::Idle;
    s.i_batch = -1;
    s.last_used = ++tick_;
    // After the caller has its answer: the step's KV goes to the session's journal. An
    // anonymous request's KV stays in its sequence and goes to the prompt cache only when the
    // sequence is wanted for other tokens: a next turn that lands here again costs no copy.
    if (!s.cache.empty() && r != FinishReason::Error) {
        // A cancelled request's computed tokens are as good as a finished one's.
        if (s.owner.empty()) {
            s.unsaved = cache_ != nullptr;  // saved when the sequence is wanted for other tokens
        } else if (journal_ && r != FinishReason::Cancelled) {
            journal_step(s);
        }
    }
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

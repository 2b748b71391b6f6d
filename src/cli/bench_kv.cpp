#include "cli/bench_kv.h"

#include "common/cli_exit.h"
#include "common/rss.h"
#include "engine/engine.h"
#include "engine/memory_budget.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace armada::cli {

namespace {
namespace fs = std::filesystem;
using engine::Engine;
using engine::EngineConfig;
using engine::GenEvent;
using engine::Tokens;

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

Tokens tokens(int seed, int n) {
    Tokens t;
    for (int k = 0; k < n; ++k)
        t.push_back(llama_token(1000 + (seed * 7919 + k * 31) % 30000));
    return t;
}

Tokens concat(Tokens a, const Tokens & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

//! Submits requests and waits for their Done events.
class Runner {
  public:
    explicit Runner(Engine & e) : e_(e) {}

    std::unique_ptr<engine::GenRequest> make(const Tokens & prompt, const std::string & session,
                                             const std::string & tenant = {}, int prefix_len = 0, int max_tokens = 1) {
        auto r = std::make_unique<engine::GenRequest>();
        r->prompt = prompt;
        engine::FastSamplerParams sp;
        sp.temperature = 0;
        r->fast = std::make_unique<engine::FastSampler>(sp);
        r->max_tokens = max_tokens;
        r->session = session;
        r->tenant = tenant;
        r->prefix_len = prefix_len;
        return r;
    }

    //! Runs every request concurrently; returns their Done events in order.
    std::vector<GenEvent> all(std::vector<std::unique_ptr<engine::GenRequest>> reqs) {
        std::vector<GenEvent> out(reqs.size());
        size_t left = reqs.size();
        std::mutex mu;
        std::condition_variable cv;
        for (size_t i = 0; i < reqs.size(); ++i) {
            reqs[i]->sink = [&, i](GenEvent && ev) {
                if (ev.kind != GenEvent::Kind::Done) return;
                std::lock_guard lk(mu);
                out[i] = std::move(ev);
                if (--left == 0) cv.notify_all();
            };
            if (e_.submit(std::move(reqs[i])) != engine::SubmitStatus::Accepted) {
                std::lock_guard lk(mu);
                out[i].finish = engine::FinishReason::Error;
                out[i].error = "refused";
                --left;
            }
        }
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return left == 0; });
        return out;
    }

    GenEvent one(std::unique_ptr<engine::GenRequest> r) {
        std::vector<std::unique_ptr<engine::GenRequest>> v;
        v.push_back(std::move(r));
        return all(std::move(v))[0];
    }

  private:
    Engine & e_;
};

struct LatencyRow {
    int context = 0;
    double reprefill_ms = 0, ram_ms = 0, disk_ms = 0, journal_ms = 0, park_ms = 0, restore_ms = 0;
    uint64_t bytes = 0;
    std::string check;
};

EngineConfig base_config(const BenchKvOptions & opt, int n_seq, int n_ctx_seq, const std::string & dir) {
    EngineConfig c;
    c.n_seq_max = n_seq;
    c.n_ctx = n_seq * n_ctx_seq;
    c.n_threads = opt.threads;
    c.chunk = 512;
    c.n_batch = 2048;
    c.kv_dir = dir;
    c.kv_budget = 16ull << 30;
    c.park_grace_ms = 3600 * 1000;  // park by eviction only, at known moments
    c.queue_max = std::max(256, opt.sessions);
    return c;
}

uint64_t tight_budget(const std::shared_ptr<engine::Model> & m, const EngineConfig & c) {
    Engine probe(m, c, nullptr);
    if (!probe.start().empty()) return 0;
    return probe.kv_bytes_per_cell() * uint64_t(c.n_ctx) * 10 / 9 + 4096;
}

// Resume latency: time to first token of the next step of a session holding `ctx` tokens, when
// its KV is re-prefilled versus restored from RAM or disk.
LatencyRow latency(const std::shared_ptr<engine::Model> & m, const BenchKvOptions & opt, int ctx,
                   const std::string & dir) {
    LatencyRow row;
    row.context = ctx;
    const int n_ctx_seq = ((ctx + 64 + 255) / 256) * 256;
    const Tokens tail = tokens(999, 16);
    std::vector<double> pre, ram, disk, journal, park, restore;
    bool ok = true;
    for (int rep = 0; rep < opt.repeats; ++rep) {
        const Tokens held = tokens(rep * 10 + ctx, ctx);
        const Tokens next = concat(held, tail);
        {
            EngineConfig c = base_config(opt, 2, n_ctx_seq, {});
            c.park = false;
            Engine e(m, c, nullptr);
            if (auto err = e.start(); !err.empty()) {
                fprintf(stderr, "engine: %s\n", err.c_str());
                return row;
            }
            Runner r(e);
            const GenEvent ev = r.one(r.make(next, "s"));
            ok = ok && ev.n_cached == 0;
            pre.push_back(ev.ttft_s * 1000);
        }
        // RAM; disk through the pool's spill file; disk through the session's KV journal (the
        // spill only frees RAM, the restore folds the journal).
        for (const std::string mode : {"ram", "disk", "journal"}) {
            const bool to_disk = mode != "ram";
            EngineConfig c = base_config(opt, 2, n_ctx_seq, to_disk ? dir : std::string());
            c.kv_journal = mode == "journal";
            if (to_disk) c.kv_budget = tight_budget(m, c);
            Engine e(m, c, nullptr);
            if (auto err = e.start(); !err.empty()) {
                fprintf(stderr, "engine: %s\n", err.c_str());
                return row;
            }
            Runner r(e);
            r.one(r.make(held, "s"));
            // Two other sessions take both sequences: "s" is parked (and spilled, on disk).
            std::vector<std::unique_ptr<engine::GenRequest>> others;
            others.push_back(r.make(tokens(1, 32), "x1"));
            others.push_back(r.make(tokens(2, 32), "x2"));
            r.all(std::move(others));
            const uint64_t park_ns = e.stats().park_ns.load();  // the save of "s" alone
            const auto u = e.kv_usage("s");
            ok = ok && u && u->where == (to_disk ? "disk" : "ram");
            if (u && !to_disk) row.bytes = u->bytes;
            const GenEvent ev = r.one(r.make(next, "s"));
            if (ev.kv_source != mode || ev.n_cached < ctx || !u || u->where != (to_disk ? "disk" : "ram")) {
                fprintf(stderr, "context %d, %s: held in %s, restored from '%s' with %d cached tokens\n", ctx,
                        mode.c_str(), u ? u->where.c_str() : "nothing", ev.kv_source.c_str(), ev.n_cached);
            }
            ok = ok && ev.kv_source == mode && ev.n_cached >= ctx;
            (mode == "ram" ? ram : mode == "disk" ? disk : journal).push_back(ev.ttft_s * 1000);
            if (!to_disk) {
                // The engine's own timing of the save of "s" and of its restore.
                park.push_back(double(park_ns) / 1e6);
                restore.push_back(double(e.stats().restore_ns.load()) / 1e6);
            }
        }
    }
    row.reprefill_ms = median(pre);
    row.ram_ms = median(ram);
    row.disk_ms = median(disk);
    row.journal_ms = median(journal);
    row.park_ms = median(park);
    row.restore_ms = median(restore);
    row.check = ok ? "ok" : "FAILED (restore not used)";
    return row;
}

struct PrefixRow {
    double without_ms = 0, with_ms = 0;
    int hits = 0, sessions = 0;
};

// Shared prefix: TTFT of a new session's first step when the agent's prefix is computed per
// session versus restored from the pool.
PrefixRow prefix(const std::shared_ptr<engine::Model> & m, const BenchKvOptions & opt) {
    PrefixRow row;
    const int n = std::max(3, opt.repeats * 2);
    row.sessions = n;
    const int n_ctx_seq = ((opt.prefix_tokens + 128 + 255) / 256) * 256;
    const Tokens pfx = tokens(4242, opt.prefix_tokens);
    std::vector<double> with, without;
    for (bool shared : {false, true}) {
        auto cfg = base_config(opt, 2, n_ctx_seq, {});
        cfg.prefix_cache = shared;
        Engine e(m, cfg, nullptr);
        if (!e.start().empty()) return row;
        Runner r(e);
        for (int i = 0; i <= n; ++i) {
            const Tokens p = concat(pfx, tokens(500 + i, 40));
            const GenEvent ev = r.one(r.make(p, "sess" + std::to_string(i), "bench", opt.prefix_tokens));
            if (i == 0) continue;  // the first session computes it in both runs
            (shared ? with : without).push_back(ev.ttft_s * 1000);
            if (ev.kv_source == "prefix" || ev.kv_source == "copy") ++row.hits;
        }
    }
    row.without_ms = median(without);
    row.with_ms = median(with);
    return row;
}

//! Samples the process's RSS every 20 ms from construction until `stop`, keeping the peak.
class PeakRss {
  public:
    PeakRss() : base_(common::rss_bytes()), peak_(base_) {
        thread_ = std::thread([this] {
            while (on_) {
                peak_ = std::max<uint64_t>(peak_, common::rss_bytes());
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        });
    }
    ~PeakRss() { stop(); }
    PeakRss(const PeakRss &) = delete;
    PeakRss & operator=(const PeakRss &) = delete;
    uint64_t base() const { return base_; }
    uint64_t stop() {
        on_ = false;
        if (thread_.joinable()) thread_.join();
        return peak_;
    }

  private:
    const uint64_t base_;
    std::atomic<bool> on_{true};
    std::atomic<uint64_t> peak_;
    std::thread thread_;
};

struct CapacityRow {
    bool park = true;
    int created = 0, resumed_from_kv = 0, errors = 0;
    double create_s = 0, resume_s = 0;
    uint64_t rss_base = 0, rss_peak = 0, ram_bytes = 0, disk_bytes = 0, budget = 0;
};

// Capacity: create many sessions, then resume each once; count how many continue from their
// KV rather than re-prefilling, and watch RSS.
CapacityRow capacity(const std::shared_ptr<engine::Model> & m, const BenchKvOptions & opt, bool park,
                     const std::string & dir) {
    CapacityRow row;
    row.park = park;
    EngineConfig c = base_config(opt, opt.seqs, ((opt.session_tokens + 64 + 255) / 256) * 256, dir);
    c.park = park;
    c.kv_budget = engine::parse_size(opt.budget).value_or(2ull << 30);
    c.kv_disk_limit = engine::parse_size(opt.disk).value_or(64ull << 30);
    c.park_grace_ms = 100;
    row.budget = c.kv_budget;
    Engine e(m, c, nullptr);
    if (auto err = e.start(); !err.empty()) {
        fprintf(stderr, "engine: %s\n", err.c_str());
        return row;
    }
    PeakRss rss;
    row.rss_base = rss.base();
    Runner r(e);
    const int wave = opt.seqs * 8;
    auto t0 = std::chrono::steady_clock::now();
    for (int base = 0; base < opt.sessions; base += wave) {
        std::vector<std::unique_ptr<engine::GenRequest>> reqs;
        for (int i = base; i < std::min(opt.sessions, base + wave); ++i)
            reqs.push_back(r.make(tokens(i, opt.session_tokens), "s" + std::to_string(i), {}, 0, 2));
        for (const auto & ev : r.all(std::move(reqs)))
            (ev.finish == engine::FinishReason::Error ? row.errors : row.created)++;
        fprintf(stderr, "\rcapacity (%s): created %d/%d   ", park ? "parking" : "no parking", row.created,
                opt.sessions);
    }
    row.create_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    for (int base = 0; base < opt.sessions; base += wave) {
        std::vector<std::unique_ptr<engine::GenRequest>> reqs;
        for (int i = base; i < std::min(opt.sessions, base + wave); ++i) {
            reqs.push_back(
                r.make(concat(tokens(i, opt.session_tokens), tokens(77, 8)), "s" + std::to_string(i), {}, 0, 2));
        }
        for (const auto & ev : r.all(std::move(reqs))) {
            if (ev.finish == engine::FinishReason::Error) ++row.errors;
            if (ev.n_cached >= opt.session_tokens) ++row.resumed_from_kv;
        }
        fprintf(stderr, "\rcapacity (%s): resumed %d/%d   ", park ? "parking" : "no parking",
                std::min(opt.sessions, base + wave), opt.sessions);
    }
    fputc('\n', stderr);
    row.resume_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    row.rss_peak = rss.stop();
    const auto ps = e.pool().stats();
    row.ram_bytes = ps.ram_bytes;
    row.disk_bytes = ps.disk_bytes;
    return row;
}

struct FloodRow {
    int requests = 0, errors = 0;
    uint64_t rss_base = 0, rss_peak = 0, cache_ram = 0, evicted = 0, saves = 0, budget = 0, ram_limit = 0;
};

// Prompt-cache flood: anonymous requests with distinct prompts, no disk tier. Every finished
// request becomes a cache entry; eviction must keep them inside the KV budget.
FloodRow cache_flood(const std::shared_ptr<engine::Model> & m, const BenchKvOptions & opt) {
    FloodRow row;
    EngineConfig c = base_config(opt, opt.seqs, ((opt.session_tokens + 64 + 255) / 256) * 256, {});
    c.kv_budget = engine::parse_size(opt.budget).value_or(2ull << 30);
    row.budget = c.kv_budget;
    Engine e(m, c, nullptr);
    if (auto err = e.start(); !err.empty()) {
        fprintf(stderr, "engine: %s\n", err.c_str());
        row.errors = 1;
        return row;
    }
    PeakRss rss;
    row.rss_base = rss.base();
    Runner r(e);
    const int wave = opt.seqs * 8;
    for (int base = 0; base < opt.cache_flood; base += wave) {
        std::vector<std::unique_ptr<engine::GenRequest>> reqs;
        for (int i = base; i < std::min(opt.cache_flood, base + wave); ++i)
            reqs.push_back(r.make(tokens(100000 + i, opt.session_tokens), {}, "flood", 0, 2));
        for (const auto & ev : r.all(std::move(reqs)))
            (ev.finish == engine::FinishReason::Error ? row.errors : row.requests)++;
        fprintf(stderr, "\rprompt-cache flood: %d/%d   ", row.requests, opt.cache_flood);
    }
    fputc('\n', stderr);
    row.rss_peak = rss.stop();
    const auto ps = e.pool().stats();
    row.cache_ram = ps.cache_ram_bytes;
    row.evicted = ps.cache_evicted;
    row.saves = e.prefix_cache() ? e.prefix_cache()->inserts.load() : 0;
    row.ram_limit = e.pool().config().ram_limit;
    return row;
}

std::string mb(uint64_t b) {
    char s[32];
    snprintf(s, sizeof s, "%.0f", double(b) / (1024.0 * 1024.0));
    return s;
}
}  // namespace

int bench_kv(const BenchKvOptions & opt) {
    llama_log_set(quiet_log, nullptr);
    std::string err;
    auto m = engine::Model::load(opt.model, nullptr, err);
    if (!m) {
        return common::fail(err);
    }
    std::string dir = opt.dir;
    const bool temp = dir.empty();
    if (temp) dir = (fs::temp_directory_path() / ("armada-bench-kv-" + std::to_string(::getpid()))).string();
    std::ostringstream md;
    md << "Model `" << fs::path(opt.model).filename().string() << "`, threads " << opt.threads << ".\n\n";
    int rc = 0;
    if (!opt.skip_latency) {
        md << "| context tokens | KV MiB | re-prefill TTFT ms | restore from RAM TTFT ms | ratio | restore from disk "
              "TTFT ms | ratio | restore from journal TTFT ms | ratio | save (park) ms | state_seq_set ms | check |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
        for (int ctx : opt.contexts) {
            const std::string d = dir + "/lat-" + std::to_string(ctx);
            std::error_code ec;
            fs::remove_all(d, ec);
            const LatencyRow r = latency(m, opt, ctx, d);
            char line[512];
            snprintf(line, sizeof line,
                     "| %d | %.1f | %.1f | %.1f | %.3f | %.1f | %.3f | %.1f | %.3f | %.2f | %.2f | %s |\n", r.context,
                     double(r.bytes) / 1048576.0, r.reprefill_ms, r.ram_ms,
                     r.reprefill_ms > 0 ? r.ram_ms / r.reprefill_ms : 0, r.disk_ms,
                     r.reprefill_ms > 0 ? r.disk_ms / r.reprefill_ms : 0, r.journal_ms,
                     r.reprefill_ms > 0 ? r.journal_ms / r.reprefill_ms : 0, r.park_ms, r.restore_ms, r.check.c_str());
            md << line;
            fputs(line, stdout);
            fflush(stdout);
            if (r.check != "ok") rc = 1;
        }
        md << "\n";
    }
    if (!opt.skip_prefix) {
        const PrefixRow p = prefix(m, opt);
        char line[512];
        snprintf(line, sizeof line,
                 "| shared prefix %d tokens | computed per session: TTFT %.1f ms | restored: TTFT %.1f ms | saved "
                 "%.1f ms (%.0f%%) | hits %d/%d |\n",
                 opt.prefix_tokens, p.without_ms, p.with_ms, p.without_ms - p.with_ms,
                 p.without_ms > 0 ? 100.0 * (p.without_ms - p.with_ms) / p.without_ms : 0, p.hits, p.sessions);
        md << "| prefix | per session | shared | saved | hits |\n|---|---|---|---|---|\n" << line << "\n";
        fputs(line, stdout);
        if (p.hits != p.sessions) rc = 1;
    }
    if (!opt.skip_capacity) {
        md << "| parking | sessions | resumed from KV | errors | create s | resume all s | parked RAM MiB | parked "
              "disk MiB | RSS start MiB | RSS peak MiB | budget MiB | weights MiB | peak − budget − weights MiB |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
        std::vector<bool> modes = {true};
        if (opt.capacity_without_parking) modes.push_back(false);
        for (bool park : modes) {
            const CapacityRow c = capacity(m, opt, park, dir + (park ? "/cap" : "/cap-off"));
            std::ostringstream line;
            line << "| " << (park ? "on" : "off") << " | " << c.created << " | " << c.resumed_from_kv << " | "
                 << c.errors << " | " << std::fixed;
            line.precision(1);
            line << c.create_s << " | " << c.resume_s << " | " << mb(c.ram_bytes) << " | " << mb(c.disk_bytes) << " | "
                 << mb(c.rss_base) << " | " << mb(c.rss_peak) << " | " << mb(c.budget) << " | " << mb(m->size_bytes())
                 << " | " << (double(c.rss_peak) - double(c.budget + m->size_bytes())) / 1048576.0 << " |\n";
            md << line.str();
            fputs(line.str().c_str(), stdout);
            fflush(stdout);
            if (c.errors > 0) rc = 1;
            if (park && opt.max_rss_overhead_mb > 0) {
                const double limit = double(c.budget + m->size_bytes()) + opt.max_rss_overhead_mb * 1048576.0;
                if (double(c.rss_peak) > limit) {
                    fprintf(stderr, "error: peak RSS %s MiB exceeds budget + weights + %.0f MiB = %.0f MiB\n",
                            mb(c.rss_peak).c_str(), opt.max_rss_overhead_mb, limit / 1048576.0);
                    rc = 1;
                }
            }
            if (park && c.resumed_from_kv != c.created) {
                fprintf(stderr, "error: %d of %d sessions re-prefilled although parking was on\n",
                        c.created - c.resumed_from_kv, c.created);
                rc = 1;
            }
        }
    }
    if (opt.cache_flood > 0) {
        const FloodRow f = cache_flood(m, opt);
        std::ostringstream line;
        line << "| " << f.requests << " | " << f.errors << " | " << f.saves << " | " << f.evicted << " | "
             << mb(f.cache_ram) << " | " << mb(f.rss_base) << " | " << mb(f.rss_peak) << " | " << mb(f.budget) << " | "
             << mb(m->size_bytes()) << " |\n";
        md << "| cache flood requests | errors | entries saved | evicted | cache RAM MiB | RSS start MiB | RSS peak "
              "MiB | budget MiB | weights MiB |\n|---|---|---|---|---|---|---|---|---|\n"
           << line.str();
        fputs(line.str().c_str(), stdout);
        if (f.errors > 0) rc = 1;
        // Every request left an entry behind; with no disk tier, only eviction keeps them in bounds.
        if (f.saves + 2 * uint64_t(opt.seqs) < uint64_t(f.requests) || f.evicted == 0) {
            fprintf(stderr,
                    "error: the flood saved %llu entries and evicted %llu: the prompt cache was not exercised\n",
                    static_cast<unsigned long long>(f.saves), static_cast<unsigned long long>(f.evicted));
            rc = 1;
        }
        if (f.cache_ram > f.ram_limit) {
            fprintf(stderr, "error: the prompt cache holds %s MiB in RAM, over the pool's %s MiB share of the budget\n",
                    mb(f.cache_ram).c_str(), mb(f.ram_limit).c_str());
            rc = 1;
        }
        if (opt.max_rss_overhead_mb > 0) {
            const double limit = double(f.budget + m->size_bytes()) + opt.max_rss_overhead_mb * 1048576.0;
            if (double(f.rss_peak) > limit) {
                fprintf(stderr, "error: peak RSS %s MiB in the cache flood exceeds budget + weights + %.0f MiB\n",
                        mb(f.rss_peak).c_str(), opt.max_rss_overhead_mb);
                rc = 1;
            }
        }
    }
    if (!opt.output.empty()) {
        std::ofstream(opt.output) << md.str();
    }
    if (temp) {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    return rc;
}

}  // namespace armada::cli

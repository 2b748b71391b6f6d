#include "cli/bench_engine.h"

#include "common/cli_exit.h"
#include "engine/engine.h"
#include "engine/grammar_fast.h"
#include "obs/metrics.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace armada::cli {

namespace {
using Clock = std::chrono::steady_clock;

struct RunResult {
    int streams = 0;
    double tg_tokens_per_s = 0;
    double pp_tokens_per_s = 0;
    int64_t prompt_tokens = 0;  // prompt tokens of the timed requests
    int64_t reused_tokens = 0;  // of those, the ones found in the sequence (the depth)
    // Where the decode phase's wall time went on the engine thread (the engine's own timers):
    // inside llama_decode, after it (sampling, detokenising, the sinks), and the rest (between
    // steps: planning the next batch, waiting for work).
    double tg_s = 0, decode_s = 0, sample_s = 0;
    uint64_t decode_calls = 0;
};

// The sum and count of one of the engine's histograms.
std::pair<double, uint64_t> histogram_total(obs::Registry & reg, const char * name, const char * help) {
    std::vector<uint64_t> buckets;
    double sum = 0;
    uint64_t count = 0;
    reg.histogram(name, help, obs::latency_buckets()).snapshot(buckets, sum, count);
    return {sum, count};
}

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

// Runs `streams` sequences of n_prompt + n_gen tokens at once on a fresh engine. Decode speed
// counts the tokens generated after every sequence has its first token, over that time, which is
// what llama-batched-bench reports as S_TG.
RunResult run_streams(const std::shared_ptr<engine::Model> & model, const BenchEngineOptions & opt, int streams) {
    engine::EngineConfig cfg;
    cfg.n_seq_max = streams;
    cfg.n_ctx = opt.n_ctx > 0 ? opt.n_ctx : streams * (opt.depth + opt.n_prompt + opt.n_gen + 16);
    cfg.n_threads = opt.threads;
    cfg.chunk = std::max(opt.n_prompt, 32);
    cfg.n_batch = 2048;
    obs::Registry reg;
    engine::Engine eng(model, cfg, &reg);
    // The histograms as the engine named them (the registry returns the engine's own).
    auto decode_total = [&] {
        return histogram_total(reg, "armada_engine_decode_seconds",
                               "Time per llama_decode call (one batch through the model)");
    };
    auto sample_total = [&] {
        return histogram_total(reg, "armada_engine_sample_seconds",
                               "Time after each llama_decode call to sample, stream and save the batch's "
                               "sequences (engine thread, model idle)");
    };
    std::pair<double, uint64_t> decode_at_start, sample_at_start;
    if (auto e = eng.start(); !e.empty()) {
        fprintf(stderr, "engine: %s\n", e.c_str());
        return {};
    }
    auto tokens = [](int stream, int n) {
        std::vector<llama_token> t;
        for (int k = 0; k < n; ++k)
            t.push_back(llama_token(1000 + (stream * 131 + k * 7) % 20000));
        return t;
    };
    std::mutex mu;
    std::condition_variable cv;
    int done = 0, started = 0;
    if (opt.depth > 0) {
        // Each sequence first holds `depth` tokens (not timed); the timed request then extends
        // them, and the engine computes only its new tokens, as in a session's later step.
        for (int i = 0; i < streams; ++i) {
            auto r = std::make_unique<engine::GenRequest>();
            r->prompt = tokens(i, opt.depth);
            r->fast = std::make_unique<engine::FastSampler>(engine::FastSamplerParams{});
            r->max_tokens = 1;
            r->sink = [&](engine::GenEvent && ev) {
                if (ev.kind == engine::GenEvent::Kind::Text) return;
                std::lock_guard lk(mu);
                if (++done == streams) cv.notify_all();
            };
            eng.submit(std::move(r));
        }
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return done == streams; });
        done = 0;
    }
    int64_t gen_total = 0, prompt_total = 0, reused_total = 0;
    Clock::time_point t_all_started, t_end;
    const auto t0 = Clock::now();
    for (int i = 0; i < streams; ++i) {
        auto r = std::make_unique<engine::GenRequest>();
        r->prompt = tokens(i, opt.depth + opt.n_prompt);
        // Greedy, as the server samples a plain request; end-of-generation tokens are masked
        // so no stream stops early, like batched-bench.
        engine::FastSamplerParams sp;
        sp.temperature = 0;
        for (llama_token t = 0; t < model->n_vocab(); ++t) {
            if (model->is_eog(t)) sp.logit_bias.push_back({t, -INFINITY});
        }
        if (opt.grammar.empty())
            r->fast = std::make_unique<engine::FastSampler>(sp);
        else
            r->gfast = std::make_unique<engine::GrammarFast>(*model, opt.grammar, "", sp);
        r->max_tokens = opt.n_gen;
        int seen = 0;
        r->sink = [&, seen](engine::GenEvent && ev) mutable {
            std::lock_guard lk(mu);
            // On the engine thread: the timers are read where the decode phase starts.
            auto phase_starts = [&] {
                t_all_started = Clock::now();
                decode_at_start = decode_total();
                sample_at_start = sample_total();
            };
            if (ev.kind == engine::GenEvent::Kind::Text) {
                if (seen++ == 0 && ++started == streams) phase_starts();
                return;
            }
            if (seen == 0 && ++started == streams) phase_starts();
            gen_total += ev.n_generated - 1;
            prompt_total += ev.n_prompt;
            reused_total += ev.n_cached;
            if (++done == streams) {
                t_end = Clock::now();
                cv.notify_all();
            }
        };
        eng.submit(std::move(r));
    }
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return done == streams; });
    RunResult res;
    res.streams = streams;
    const double tg = std::chrono::duration<double>(t_end - t_all_started).count();
    const double pp = std::chrono::duration<double>(t_all_started - t0).count();
    res.tg_tokens_per_s = tg > 0 ? double(gen_total) / tg : 0;
    res.pp_tokens_per_s = pp > 0 ? double(streams * opt.n_prompt) / pp : 0;
    res.prompt_tokens = prompt_total;
    res.reused_tokens = reused_total;
    const auto decode_end = decode_total();
    const auto sample_end = sample_total();
    res.tg_s = tg;
    res.decode_s = decode_end.first - decode_at_start.first;
    res.sample_s = sample_end.first - sample_at_start.first;
    res.decode_calls = decode_end.second - decode_at_start.second;
    return res;
}

// Runs llama-batched-bench with matching settings and returns S_TG per stream count.
std::vector<double> run_batched_bench(const BenchEngineOptions & opt, int n_ctx) {
    std::ostringstream cmd;
    std::string npl;
    for (int s : opt.streams)
        npl += (npl.empty() ? "" : ",") + std::to_string(s);
    cmd << opt.batched_bench << " -m " << opt.model << " -c " << n_ctx << " -b 2048 -ub 512 -npp " << opt.n_prompt
        << " -ntg " << opt.n_gen << " -npl " << npl << " --output-format jsonl";
    if (opt.threads > 0) cmd << " -t " << opt.threads;
    cmd << " 2>/dev/null";
    printf("peer: %s\n", cmd.str().c_str());
    std::vector<double> out(opt.streams.size(), 0);
    FILE * p = popen(cmd.str().c_str(), "r");
    if (!p) return out;
    char line[4096];
    while (fgets(line, sizeof(line), p)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.contains("pl")) continue;
        const int pl = j["pl"].get<int>();
        for (size_t i = 0; i < opt.streams.size(); ++i) {
            if (opt.streams[i] == pl) out[i] = j.value("speed_tg", 0.0);
        }
    }
    pclose(p);
    return out;
}
// Runs llama-bench's prompt test at the depth (n_prompt tokens appended to a sequence holding
// `depth`) and returns its mean tokens/s; 0 when it could not be read.
double run_llama_bench(const BenchEngineOptions & opt) {
    std::ostringstream cmd;
    cmd << opt.llama_bench << " -m " << opt.model << " -p " << opt.n_prompt << " -n 0 -d " << opt.depth
        << " -b 2048 -ub 512 -r 5 -o jsonl";
    if (opt.threads > 0) cmd << " -t " << opt.threads;
    cmd << " 2>/dev/null";
    printf("peer: %s\n", cmd.str().c_str());
    double ts = 0;
    FILE * p = popen(cmd.str().c_str(), "r");
    if (!p) return 0;
    char line[8192];
    while (fgets(line, sizeof(line), p)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;
        if (j.value("n_prompt", -1) == opt.n_prompt && j.value("n_gen", -1) == 0 && j.value("n_depth", -1) == opt.depth)
            ts = j.value("avg_ts", 0.0);
    }
    pclose(p);
    return ts;
}
}  // namespace

int bench_engine(const BenchEngineOptions & opt) {
    llama_log_set(quiet_log, nullptr);
    std::string err;
    auto model = engine::Model::load(opt.model, nullptr, err);
    if (!model) {
        return common::fail(err);
    }
    if (opt.depth > 0 && !opt.batched_bench.empty()) {
        return common::fail("--depth has no llama-batched-bench equivalent; leave out --batched-bench", 2);
    }
    if (!opt.llama_bench.empty() && (opt.depth <= 0 || opt.streams != std::vector<int>{1})) {
        return common::fail("--llama-bench compares the prompt rate at a depth: give --depth and --streams 1", 2);
    }
    if (!opt.grammar.empty()) {
        try {
            engine::GrammarFast check(*model, opt.grammar, "", engine::FastSamplerParams{});
        } catch (const std::invalid_argument & e) {
            return common::fail(fmt::format("--grammar: {}", e.what()), 2);
        }
    }
    const int max_streams = *std::max_element(opt.streams.begin(), opt.streams.end());
    const int n_ctx = opt.n_ctx > 0 ? opt.n_ctx : max_streams * (opt.depth + opt.n_prompt + opt.n_gen + 16);
    // Rounds alternate the two sides so that machine noise hits both; medians are reported.
    std::vector<std::vector<double>> ours_r(opt.streams.size()), pp_r(opt.streams.size()), peer_r(opt.streams.size());
    std::vector<double> depth_peer;  // llama-bench's prompt rate at the depth, per round
    for (int round = 0; round < std::max(1, opt.rounds); ++round) {
        for (size_t i = 0; i < opt.streams.size(); ++i) {
            const RunResult r = run_streams(model, opt, opt.streams[i]);
            ours_r[i].push_back(r.tg_tokens_per_s);
            pp_r[i].push_back(r.pp_tokens_per_s);
            printf(
                "round %d armada  streams=%-4d decode %.1f tok/s  prompt %.1f tok/s  reused %lld of %lld prompt "
                "tokens\n",
                round, opt.streams[i], r.tg_tokens_per_s, r.pp_tokens_per_s, static_cast<long long>(r.reused_tokens),
                static_cast<long long>(r.prompt_tokens));
            if (r.tg_s > 0 && r.decode_calls > 0) {
                const double rest = r.tg_s - r.decode_s - r.sample_s;
                printf(
                    "  engine thread over the decode phase (%.2f s, %llu llama_decode calls): in llama_decode %.1f%% "
                    "(%.2f ms a call), after it %.1f%% (%.3f ms a call), between %.1f%%\n",
                    r.tg_s, static_cast<unsigned long long>(r.decode_calls), 100 * r.decode_s / r.tg_s,
                    1000 * r.decode_s / double(r.decode_calls), 100 * r.sample_s / r.tg_s,
                    1000 * r.sample_s / double(r.decode_calls), 100 * rest / r.tg_s);
            }
            fflush(stdout);
        }
        if (!opt.llama_bench.empty()) {
            depth_peer.push_back(run_llama_bench(opt));
            printf("round %d llama-bench prompt %d tokens at depth %d: %.1f tok/s\n", round, opt.n_prompt, opt.depth,
                   depth_peer.back());
        }
        if (opt.batched_bench.empty()) continue;
        const auto peer = run_batched_bench(opt, n_ctx);
        for (size_t i = 0; i < opt.streams.size(); ++i) {
            peer_r[i].push_back(peer[i]);
            printf("round %d batched streams=%-4d decode %.1f tok/s\n", round, opt.streams[i], peer[i]);
        }
    }
    auto median = [](std::vector<double> v) {
        if (v.empty()) return 0.0;
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    std::vector<RunResult> ours(opt.streams.size());
    std::vector<double> peer;
    for (size_t i = 0; i < opt.streams.size(); ++i) {
        ours[i].streams = opt.streams[i];
        ours[i].tg_tokens_per_s = median(ours_r[i]);
        if (!opt.batched_bench.empty()) peer.push_back(median(peer_r[i]));
        const double pr = peer.empty() ? 0 : peer[i];
        ours[i].pp_tokens_per_s = median(pp_r[i]);
        printf(
            "median streams=%-4d armada %.1f tok/s  batched-bench %.1f tok/s  ratio %.3f  armada prompt %.1f tok/s\n",
            opt.streams[i], ours[i].tg_tokens_per_s, pr, pr > 0 ? ours[i].tg_tokens_per_s / pr : 0.0,
            ours[i].pp_tokens_per_s);
    }
    if (!depth_peer.empty()) {
        const double ours_pp = median(pp_r[0]), peer_pp = median(depth_peer);
        printf("median prompt at depth %d: armada %.1f tok/s  llama-bench %.1f tok/s  ratio %.3f\n", opt.depth, ours_pp,
               peer_pp, peer_pp > 0 ? ours_pp / peer_pp : 0.0);
    }
    if (!opt.output.empty()) {
        std::ofstream f(opt.output);
        f << "| streams | armada decode tok/s | llama-batched-bench S_TG tok/s | ratio |\n|---|---|---|---|\n";
        for (size_t i = 0; i < opt.streams.size(); ++i) {
            const double pr = peer.empty() ? 0 : peer[i];
            char row[256];
            snprintf(row, sizeof(row), "| %d | %.1f | %.1f | %.3f |\n", opt.streams[i], ours[i].tg_tokens_per_s, pr,
                     pr > 0 ? ours[i].tg_tokens_per_s / pr : 0.0);
            f << row;
        }
    }
    return 0;
}

}  // namespace armada::cli

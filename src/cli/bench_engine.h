#pragma once

#include <string>
#include <vector>

namespace armada::cli {

//! Options of `armada bench engine`.
struct BenchEngineOptions {
    std::string model;
    std::vector<int> streams = {1, 16, 64};
    int n_prompt = 32;
    int n_gen = 128;
    //! Tokens each sequence already holds before the timed request, which extends them: the
    //! prompt rate is then that of a later step's new tokens at this depth.
    int depth = 0;
    int n_ctx = 0;  // 0: enough for the largest stream count
    int threads = 0;
    int rounds = 3;             // alternating rounds; medians are reported
    std::string batched_bench;  // path of llama-batched-bench to compare against, optional
    //! Path of llama-bench, to compare the prompt rate at `depth` against (its `-p N -d D` test:
    //! N tokens appended to a sequence holding D), one stream; optional.
    std::string llama_bench;
    std::string output;  // Markdown report file, optional
    //! A GBNF grammar every stream is sampled under (the tool-call path's sampler), so the rates
    //! include what grammar sampling costs per sequence. Empty: the plain greedy sampler.
    std::string grammar;
};

//! Measures aggregate decode tokens/s at each stream count; returns the exit code.
int bench_engine(const BenchEngineOptions & opt);

}  // namespace armada::cli

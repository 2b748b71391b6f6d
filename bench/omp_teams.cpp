// Decode speed by the thread that calls llama_decode (docs/BENCHMARKS.md, "a second OpenMP
// team"). Build and run against the cached llama.cpp:
//   L=~/.cache/armada/llama.cpp-v0.4.0
//   g++ -O2 -std=c++17 bench/omp_teams.cpp -I$L/include -L$L/lib -lllama -lggml -lggml-base \
//       -Wl,-rpath,$L/lib -o /tmp/omp_teams
//   /tmp/omp_teams MODEL.gguf main-first    # a run on the main thread, then on a second thread
//   /tmp/omp_teams MODEL.gguf thread-only   # the main thread never decodes
// Each run: a 32-token prompt, then 128 greedy single-token decodes, 2 threads.
#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

static double run(llama_model * m) {
    auto cp = llama_context_default_params();
    cp.n_ctx = 11264;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(m, cp);
    llama_batch b = llama_batch_init(2048, 0, 1);
    auto add = [&](llama_token t, int pos, bool logits) {
        b.token[b.n_tokens] = t;
        b.pos[b.n_tokens] = pos;
        b.n_seq_id[b.n_tokens] = 1;
        b.seq_id[b.n_tokens][0] = 0;
        b.logits[b.n_tokens] = logits;
        b.n_tokens++;
    };
    b.n_tokens = 0;
    for (int k = 0; k < 32; ++k)
        add(1000 + k * 7, k, k == 31);
    llama_decode(ctx, b);
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 128; ++i) {
        const float * lg = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int v = 1; v < nv; ++v)
            if (lg[v] > lg[best]) best = v;
        b.n_tokens = 0;
        add(best, 32 + i, true);
        llama_decode(ctx, b);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    llama_batch_free(b);
    llama_free(ctx);
    return 128 / s;
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf main-first|thread-only\n", argv[0]);
        return 2;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model * m = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!m) return 1;
    const bool main_first = strcmp(argv[2], "main-first") == 0;
    for (int r = 0; r < 4; ++r) {
        const double on_main = main_first ? run(m) : 0;
        double on_thread = 0;
        std::thread th([&] { on_thread = run(m); });
        th.join();
        printf("main %.1f  second thread %.1f tok/s\n", on_main, on_thread);
        fflush(stdout);
    }
    llama_model_free(m);
    return 0;
}

#pragma once
// Greedy requests for the model tests: a sampler that cannot end early (end-of-generation tokens
// are banned), a request built with it, and a blocking run that collects the text and the final
// event.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

namespace armada::testing {

struct GreedyResult {
    std::string text;
    engine::GenEvent done;
};

//! A greedy request for `prompt`; the caller sets session, tenant, prefix hints and the sink.
inline std::unique_ptr<engine::GenRequest> greedy_request(const engine::Model & m, engine::Tokens prompt,
                                                          int max_tokens) {
    auto r = std::make_unique<engine::GenRequest>();
    r->prompt = std::move(prompt);
    common_params_sampling sp;
    sp.temp = 0;
    sp.no_perf = true;
    for (llama_token t = 0; t < m.n_vocab(); ++t) {
        if (m.is_eog(t)) sp.logit_bias.push_back({t, -INFINITY});
    }
    r->sampler.reset(common_sampler_init(m.get(), sp));
    r->max_tokens = max_tokens;
    r->render_special = true;
    return r;
}

//! Submits `r` and waits for its Done event.
inline GreedyResult run_to_end(engine::Engine & e, std::unique_ptr<engine::GenRequest> r) {
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    GreedyResult out;
    r->sink = [&](engine::GenEvent && ev) {
        std::lock_guard lk(mu);
        if (ev.kind == engine::GenEvent::Kind::Text) {
            out.text += ev.text;
            return;
        }
        out.done = ev;
        finished = true;
        cv.notify_all();
    };
    EXPECT_EQ(e.submit(std::move(r)), engine::SubmitStatus::Accepted);
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return finished; });
    return out;
}

inline engine::Tokens concat(engine::Tokens a, const engine::Tokens & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

}  // namespace armada::testing

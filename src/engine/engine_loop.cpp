// The engine loop: each turn builds one batch, runs one llama_decode, then samples, streams and
// finishes the batch's sequences. The engine thread alone runs it.

#include "engine/engine_parts.h"

#include "common/clock.h"
#include "engine/batch_planner.h"
#include "engine/topology.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

namespace armada::engine {

using detail::batch_add;
using detail::Clock;
using detail::seconds_since;

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

}  // namespace armada::engine

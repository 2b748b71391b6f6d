#pragma once

#include "net/sse.h"
#include "routing/pool_set.h"
#include "routing/rules.h"
#include "routing/step_pool.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace armada::net {
class CancelToken;
}

namespace armada::routing {

//! The body of a pool step for an upstream's /v1/completions: the rendered prompt as token ids,
//! the token limit, sampling and stops. A step with tools on carries the tool-call grammar in
//! the upstream's dialect: llama.cpp's `grammar` with its lazy triggers and preserved tokens, or
//! (`json_schema`) a `response_format` whose schema is one of the tools' {name, arguments},
//! for a step that must call one; a step that may call one is then sent without a constraint.
nlohmann::json pool_step_body(const PoolStep & step, const std::string & model, GrammarDialect d);

//! A call read from a `response_format` reply ({"name": …, "arguments": {…}}); nullopt when the
//! text is not one.
std::optional<common_chat_msg> call_from_schema_reply(const std::string & text);

//! Reads an upstream's SSE stream of completion chunks: text pieces, the finish reason, usage.
class CompletionStream {
  public:
    //! Feeds bytes as they arrive; `on_text` gets each non-empty piece of text.
    void feed(std::string_view bytes, const std::function<void(const std::string &)> & on_text);
    //! The upstream's reply ended: a last chunk it never closed with a blank line still counts.
    void end(const std::function<void(const std::string &)> & on_text);
    bool done() const { return done_; }  // [DONE] or a chunk with a finish reason was read
    const std::string & finish() const { return finish_; }
    int32_t prompt_tokens() const { return prompt_; }
    int32_t completion_tokens() const { return completion_; }
    const std::string & error() const { return error_; }  // an error event from the upstream

  private:
    bool event(const std::string & data, const std::function<void(const std::string &)> & on_text);
    void chunk(const std::string & data, const std::function<void(const std::string &)> & on_text);

    net::SseReader sse_;
    bool done_ = false;
    std::string finish_, error_;
    int32_t prompt_ = -1, completion_ = -1;
};

//! The node's side of GPU pools: the routing rules decide which agent steps leave the node, and
//! each runs on one upstream of its pool over HTTP (one thread per step in flight). A step goes
//! to another upstream of the pool when one fails before answering whole; when none can take it
//! the session runs it here (see SessionManager). Cancelling the session cancels the upstream
//! request (its connection is closed).
class PoolStepRunner : public StepPool {
  public:
    //! `count` counts generated tokens when an upstream does not report usage.
    PoolStepRunner(RoutingConfig cfg, PoolSet & pools, std::function<int32_t(const std::string &)> count);
    ~PoolStepRunner() override;

    std::string route(const StepFacts & f) const override;
    int64_t context(const std::string & pool) const override;
    void run(PoolStep step, std::function<void(std::string)> on_text,
             std::function<void(PoolStepResult)> done) override;
    //! New pools and rules (SIGHUP): upstreams change as in PoolSet::reload, then the rules do.
    //! An error (nothing changed) or "".
    std::string reload(RoutingConfig cfg);
    //! Cancels every step in flight and waits for their threads.
    void stop();

  private:
    struct Flight {
        std::shared_ptr<std::atomic<bool>> cancelled;
        std::shared_ptr<armada::net::CancelToken> token;
    };
    void work(const PoolStep & step, const std::function<void(std::string)> & on_text,
              const std::function<void(PoolStepResult)> & done);
    void watch();

    mutable std::mutex cfg_mu_;
    std::shared_ptr<const RoutingConfig> cfg_;  // cfg_mu_
    PoolSet & pools_;
    std::function<int32_t(const std::string &)> count_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::list<Flight> flights_;  // mu_
    int running_ = 0;            // mu_: step threads alive
    bool stop_ = false;          // mu_
    std::thread watcher_;        // turns a session's cancel flag into a closed connection
};

}  // namespace armada::routing

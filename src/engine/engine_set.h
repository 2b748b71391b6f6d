#pragma once

#include "engine/engine.h"

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace armada::engine {

//! The engines of one node (one per NUMA node under `--numa auto`, or `--engines N`), seen as
//! one: the API services and the agent loop submit here and never pick an engine themselves.
//!
//! Routing: a request of a session goes to the engine that holds the session's KV (in a slot,
//! parked in RAM or on disk, or in its journal), so a session stays on its engine for as long as
//! its KV lives, including across a restart. Anything else goes to the engine with the most free
//! sequences, then the most free KV; engines past their KV high watermark come last.
//!
//! Every engine has the same model and settings, so n_ctx_seq and the KV size per token are
//! the same across the set. Thread-safe: the engines are fixed after construction.
class EngineSet {
  public:
    explicit EngineSet(std::vector<std::unique_ptr<Engine>> engines);
    //! A set of one engine owned elsewhere (tests, tools).
    explicit EngineSet(Engine & one);

    size_t size() const { return engines_.size(); }
    Engine & at(size_t i) const { return *engines_[i]; }

    //! Same contract as Engine::submit, on the engine `route` picks.
    SubmitStatus submit(std::unique_ptr<GenRequest> req);
    //! Index of the engine a request of `session` would go to now.
    size_t route(const std::string & session) const;
    //! The engine whose prompt cache holds the longest prefix of a session-less request, if any
    //! has room for it.
    std::optional<size_t> cached_on(const GenRequest & req) const;
    //! Whether some engine would take `n` more requests now (approximate, lock-free).
    bool has_room(int32_t n = 1) const;
    void wake();
    void release(const std::string & session, bool drop);
    //! Engine::hold on whichever engine holds the session.
    void hold(const std::string & session, int64_t ms);
    //! The session's KV journal, opened to send to another node (KvJournal::open_for_send), from
    //! whichever engine holds it. On a miss `why` says why.
    std::optional<KvJournal::SendFile> open_kv(const std::string & session, std::string & why) const;
    //! Where a journal received for `session` is written before `install_kv`, and the engine it
    //! goes to (the one `route` picks now); "" when no engine keeps a journal.
    std::pair<std::string, size_t> incoming_kv(const std::string & session) const;
    //! Engine::install_kv on engine `engine` (from `incoming_kv`).
    std::string install_kv(size_t engine, const std::string & session, const std::string & file);
    //! Where the session's KV is, and on which engine.
    std::optional<KvUsage> kv_usage(const std::string & session) const;
    //! True when every engine is past its KV high watermark: new sessions wait.
    bool kv_pressure() const;
    //! KV budget left over all engines, in bytes (an engine under pressure counts none).
    uint64_t kv_headroom() const;
    //! KV budget over all engines, in bytes.
    uint64_t kv_budget() const;
    int32_t n_ctx_seq() const { return engines_.front()->n_ctx_seq(); }
    uint64_t kv_bytes_per_cell() const { return engines_.front()->kv_bytes_per_cell(); }
    //! No request running or waiting on any engine.
    bool idle() const;
    //! "" when every engine's loop turned within `max_ms`; else which one has not, and for how long.
    std::string stalled(int64_t max_ms) const;
    void stop();

  private:
    std::vector<std::unique_ptr<Engine>> owned_;
    std::vector<Engine *> engines_;
};

}  // namespace armada::engine

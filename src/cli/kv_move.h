#pragma once

#include "agent/session_manager.h"
#include "api/http_server.h"
#include "engine/engine_set.h"
#include "engine/kv_journal.h"

#include <boost/asio/ssl/context.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace armada::cli {

//! The sending half of a session moving with its KV: answers `GET /admin/kv/{session}` with the
//! session's KV journal file, streamed in 1 MiB pieces paced on the client's reading (a journal
//! of a long session is hundreds of MiB; it never sits whole in memory). Headers say what is
//! coming: X-Armada-KV-Bytes, X-Armada-KV-Tokens, and X-Armada-KV-Fingerprint (a hash of the
//! model's fingerprint, so a node that could not use it stops before the body).
class KvSender {
  public:
    //! `cut_every` (a test hook, ARMADA_KV_SEND_CUT): every Nth send breaks off halfway; 0: none.
    KvSender(engine::EngineSet & eng, agent::SessionManager & sessions, int cut_every = 0);
    ~KvSender();
    KvSender(const KvSender &) = delete;
    KvSender & operator=(const KvSender &) = delete;

    //! Starts the send on a thread of its own (503 past 4 at once). There it answers 409 while
    //! the session is busy here or the store does not give it to another node, 404 when this
    //! node holds no journal of it; else the journal. A whole send drops the KV here.
    void send(const std::string & session, std::shared_ptr<api::Responder> out);
    //! Sends under way.
    int active() const { return active_.load(); }
    //! Sends started so far.
    uint64_t started() const { return started_.load(); }
    //! Whether a send of the session's KV has ended (whole or not) since this node started.
    bool served(const std::string & session) const;
    //! Steady-clock ms when the last send ended (0: none yet).
    int64_t last_served_ms() const { return last_served_ms_.load(); }

    static constexpr int kMaxSends = 4;

  private:
    struct Worker {
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
    };
    void run(const std::string & session, const std::shared_ptr<api::Responder> & out);

    engine::EngineSet & eng_;
    agent::SessionManager & sessions_;
    int cut_every_;
    std::atomic<int> active_{0};
    std::atomic<uint64_t> started_{0};
    std::atomic<int64_t> last_served_ms_{0};
    std::atomic<bool> stopping_{false};
    mutable std::mutex mu_;
    std::vector<Worker> workers_;   // guarded by mu_
    std::set<std::string> served_;  // guarded by mu_
};

//! The hash of a model fingerprint that X-Armada-KV-Fingerprint carries (16 hex digits).
std::string kv_fingerprint_tag(const std::string & fingerprint);

//! The receiving half: fetches the session's journal from the node at `source_url` into the
//! engine that will run it, and installs it. Never fails the move: a KV that cannot come (the
//! node is gone, the transfer breaks off, another model) is a note with kv_source "none" and the
//! reason, and the session re-prefills. `keys`: shown in turn while the source refuses one (the
//! peer key first, then an admin key: a node of the release before peer keys knows only that).
//! A journal the source says is larger than `max_bytes` (this node's --kv-disk) or than
//! `stated` (what the move command says it can be; 0: not stated) is not fetched, and no download
//! is kept past either.
agent::MoveNote fetch_kv(engine::EngineSet & eng, const std::string & session, const std::string & from_node,
                         const std::string & source_url, const std::vector<std::string> & keys,
                         boost::asio::ssl::context * tls, uint64_t max_bytes = 64ull << 30, uint64_t stated = 0);

//! Why a journal of `offered` bytes (the source's X-Armada-KV-Bytes) is not fetched, or "":
//! more than `stated` (the move command's kv_bytes, 0: not stated) or than `disk` (--kv-disk).
std::string kv_offer_problem(uint64_t offered, uint64_t stated, uint64_t disk);

}  // namespace armada::cli

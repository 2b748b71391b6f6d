#pragma once

#include "engine/kv_pool.h"

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace armada::engine {

struct KvJournalConfig {
    std::string dir;
    std::string fingerprint;
    uint64_t max_pending_bytes = 256ull << 20;  // saved states waiting for the writer; beyond it, a step is skipped
    bool sync = false;                          // fdatasync after each record (power loss, not just a crash)
    uint64_t disk_limit = 64ull << 30;          // beyond it, the journals written longest ago are deleted
};

struct KvJournalStats {
    uint64_t records = 0, bases = 0, bytes_written = 0, skipped = 0, failed = 0, coalesced = 0, loads = 0;
    uint64_t evicted = 0, disk_bytes = 0, files = 0;
};

//! Per-session KV kept on disk as the session goes, beside its checkpoint.
//!
//! After each step the engine hands over the sequence's saved state. A writer thread compares its
//! tokens with what the session's file already holds and appends only the difference: a record
//! says "keep the first N tokens, then add these cells". The file is rewritten from scratch only
//! when it has grown to twice what it describes. Every record has a checksum; reading stops at
//! the first bad or torn record, so a crash in the middle of a write loses that step's KV, never
//! the earlier ones. A file with another fingerprint (model, context, llama.cpp build) is never
//! used: the caller re-prefills.
//!
//! The state format is llama.cpp's; cutting and joining it is `SeqState`. A state that does not
//! parse is written whole every time.
//!
//! Thread-safe. The writer never blocks the caller: a step that arrives while the same session's
//! previous step is still queued replaces it, and past `max_pending_bytes` a step is skipped
//! (counted; that session then re-prefills those tokens after a crash).
class KvJournal {
  public:
    explicit KvJournal(KvJournalConfig cfg);
    ~KvJournal();
    KvJournal(const KvJournal &) = delete;
    KvJournal & operator=(const KvJournal &) = delete;

    //! Creates the directory and starts the writer. Returns an error message.
    std::string open();
    //! Queues the session's current state.
    void append(const std::string & key, KvBlob blob);
    //! The session's latest state: from the queue if it is still there, else from its file. On a
    //! miss `why` is "not journaled" or says what was wrong with the file.
    std::optional<KvBlob> load(const std::string & key, std::string & why);
    //! Forgets the session (its file is deleted).
    void erase(const std::string & key);
    bool contains(const std::string & key) const;
    //! True when the journal has (or is about to write) exactly this state of the session.
    bool holds(const std::string & key, const Tokens & tokens) const;
    //! Tokens and bytes on disk for the session, if any.
    std::optional<KvEntryInfo> info(const std::string & key) const;
    //! Waits until everything queued is written.
    void flush();

    //! The session's journal file, opened for sending to another node (a session moving with its
    //! KV). Waits up to `wait_ms` for its last state to reach the disk first. The descriptor stays
    //! valid when the file is later replaced or deleted; the caller closes it.
    struct SendFile {
        int fd = -1;
        uint64_t bytes = 0;   // of the file, as written
        size_t n_tokens = 0;  // the state it folds to
    };
    std::optional<SendFile> open_for_send(const std::string & key, std::string & why, int wait_ms = 5000);
    //! Where a journal file received from another node is written before `install` (in this
    //! journal's directory, so installing it is a rename; a leftover is swept at the next open).
    std::string incoming_path(const std::string & key) const;
    //! Takes `file` (a journal received from another node) as the session's journal: it must be
    //! one with this journal's fingerprint and the session's key, and whole records are kept up
    //! to the first torn or corrupt one. Returns an error message; on success the file is moved
    //! into place and `load` finds its state. Refused while a state of the session is queued or
    //! being written here (a newer one than the file's).
    std::string install(const std::string & key, const std::string & file);
    KvJournalStats stats() const;

    //! One file's records folded into a state. Public for tests and the fuzz target.
    static std::optional<KvBlob> read_image(const std::string & image, const std::string & fingerprint,
                                            const std::string & key, std::string & why);

  private:
    struct Known {  // what the writer last put in a session's file
        Tokens tokens;
        uint64_t file_bytes = 0;
        uint64_t live_bytes = 0;
        uint64_t written = 0;  // write order, for eviction
    };
    struct Job {
        KvBlob blob;
        bool erase = false;
        bool reset = false;  // an erase came first: start the file afresh
    };

    std::string path_for(const std::string & key) const;
    void run();
    void write(const std::string & key, KvBlob & blob, bool reset);
    void forget_locked(std::map<std::string, Known>::iterator it);
    void evict_locked(const std::string & keep);

    KvJournalConfig cfg_;
    mutable std::mutex mu_;
    std::condition_variable cv_, idle_cv_;
    std::map<std::string, Job> pending_;  // guarded by mu_
    uint64_t pending_bytes_ = 0;          // guarded by mu_
    std::string writing_;                 // key the writer is on, guarded by mu_
    Tokens writing_tokens_;               // and the tokens it is writing, guarded by mu_
    uint64_t writing_bytes_ = 0;          // and their state's size, guarded by mu_
    std::map<std::string, Known> known_;  // guarded by mu_ (written by the writer only)
    KvJournalStats stats_;                // guarded by mu_
    uint64_t tick_ = 0;                   // guarded by mu_
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace armada::engine

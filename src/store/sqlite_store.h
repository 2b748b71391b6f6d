#pragma once

#include "store/store.h"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

struct sqlite3;

namespace armada::store {

//! The embedded store: SQLite in WAL mode with synchronous=FULL. One writer thread drains the
//! queue and commits everything waiting in one transaction (group commit), then runs the
//! callbacks. Reads use a second connection under a lock; WAL lets them run beside the writer.
class SqliteStore : public Store {
  public:
    //! Opens or creates `<dir>/armada.db`. Returns nullptr and fills `error` on failure.
    static std::unique_ptr<SqliteStore> open(const std::string & dir, std::string & error);
    ~SqliteStore() override;

    void commit(Batch batch, std::function<void(Status)> done) override;
    std::optional<SessionRecord> session(const std::string & id) override;
    std::optional<ResponseRecord> response(const std::string & id) override;
    std::vector<StepRecord> steps(const std::string & id) override;
    std::vector<SessionRecord> sessions_not_in(const std::vector<std::string> & ended_states) override;
    std::optional<std::vector<SessionRecord>> sessions_of(const std::string & owner, const std::string & state,
                                                          size_t limit) override;
    std::optional<std::vector<AgentRecord>> agents() override;
    std::vector<std::string> expired(const std::vector<std::string> & states, int64_t before_ms, size_t limit) override;
    std::vector<std::string> expired_responses(int64_t before_ms, size_t limit) override;
    std::vector<MinuteCount> count_since(const std::vector<std::string> & states, int64_t since_ms) override;
    std::optional<std::vector<EndedCount>> ended_since(const std::string & cell, int64_t since_ms) override;
    Status recover() override;
    Status writable() override;

    //! Commits carried by the last transaction (for tests of group commit).
    size_t last_group_size() const { return last_group_; }

  private:
    SqliteStore() = default;
    void writer_loop();
    //! Writes the group in one transaction. An error fails all of it; otherwise `each` says per
    //! batch whether it was written or fenced.
    Status apply(const std::vector<Batch *> & group, std::vector<Status> & each);

    sqlite3 * wdb_ = nullptr;
    sqlite3 * rdb_ = nullptr;
    std::mutex rmu_;  // guards rdb_

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::pair<Batch, std::function<void(Status)>>> queue_;  // guarded by mu_
    bool stop_ = false;                                                // guarded by mu_
    std::string sticky_;                                               // guarded by mu_
    size_t last_group_ = 0;
    std::thread writer_;
};

}  // namespace armada::store

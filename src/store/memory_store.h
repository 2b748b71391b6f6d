#pragma once

// The store in memory, with the same fences as SQLite and PostgreSQL: epoch-checked assignments,
// writes fenced by (session, node, epoch), and the brains' leader marks. For unit tests of the
// layers above the store and for the simulator, where thousands of commits a second must cost
// microseconds. `set_down` makes every call fail as an unreachable server does; it counts reads
// and the rows they scanned.

#include "store/store.h"

#include <map>
#include <mutex>
#include <set>

namespace armada::store {

class MemoryStore final : public Store {
  public:
    //! Commits at once; `done` is called before `commit` returns.
    void commit(Batch batch, std::function<void(Status)> done) override;
    std::optional<SessionRecord> session(const std::string & id) override;
    std::optional<bool> has_session(const std::string & id) override;
    std::optional<ResponseRecord> response(const std::string & id) override;
    std::vector<StepRecord> steps(const std::string & id) override;
    std::vector<SessionRecord> sessions_not_in(const std::vector<std::string> & ended_states) override;
    std::optional<std::vector<SessionRecord>> sessions_of(const std::string & owner, const std::string & state,
                                                          size_t limit) override;
    std::optional<std::vector<SessionRecord>> open_sessions(const std::string & cell, const std::string & node,
                                                            const std::vector<std::string> & ended_states) override;
    std::optional<std::vector<AgentRecord>> agents() override;
    std::vector<std::string> expired(const std::vector<std::string> & states, int64_t before_ms, size_t limit) override;
    std::vector<std::string> expired_responses(int64_t before_ms, size_t limit) override;
    std::vector<MinuteCount> count_since(const std::vector<std::string> & states, int64_t since_ms) override;
    std::optional<std::vector<EndedCount>> ended_since(const std::string & cell, int64_t since_ms) override;
    Status recover() override { return down() ? Status::Error(kDown) : Status::Ok(); }
    Status writable() override { return recover(); }

    //! A session's row, not counted as a read and whether or not the store is down (checks).
    std::optional<SessionRecord> peek(const std::string & id) const;
    void set_down(bool down);
    bool down() const;
    struct Counts {
        int64_t commits = 0, refused = 0, reads = 0, rows_scanned = 0;
    };
    Counts counts() const;

  private:
    static constexpr const char * kDown = "the store cannot be reached";
    Status apply(const Batch & b);
    // The indexes PostgreSQL's schema has: open rows by cell (`sessions_open`), ended rows by
    // when they ended (`(state, updated_ms)`). A row leaves them before it changes and comes back
    // after.
    void unindex(const SessionRecord & r);
    void index(const SessionRecord & r);

    mutable std::mutex mu_;
    bool down_ = false;
    std::map<std::string, SessionRecord> sessions_;
    std::map<std::string, std::vector<StepRecord>> steps_;
    std::map<std::pair<std::string, std::string>, AgentRecord> agents_;
    std::map<std::string, ResponseRecord> responses_;
    std::map<std::string, int64_t> leaders_;  // election → the highest leader revision that wrote
    //! cell → node → its open sessions (the index's (cell, node) columns)
    std::map<std::string, std::map<std::string, std::set<std::string>>> open_;
    //! cell → (updated_ms, id) of its ended sessions (the `sessions_ended` index's columns)
    std::map<std::string, std::set<std::pair<int64_t, std::string>>> ended_;
    mutable Counts counts_;
};

}  // namespace armada::store

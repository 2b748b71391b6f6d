// The placement alone: which sessions a node's table runs, read from a real SQLite store. A
// scripted table stands in for the session manager (it records what it is asked to install, drop
// and resume, and keeps handlers until the test runs them); the session log is the real one,
// writing to the store, whose commits complete before `commit` returns.

#include "agent/placement.h"
#include "agent/session.h"
#include "mocks/scripted_table.h"
#include "store/sqlite_store.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

using namespace armada;
using namespace armada::agent;
using json = nlohmann::json;

namespace {

//! The store, with each commit complete (its callback run) before `commit` returns, so that the
//! log's handlers reach the scripted table on the test's thread. `before` runs ahead of the
//! next commit (another node's write, say).
class SyncCommits : public store::ForwardingStore {
  public:
    using ForwardingStore::ForwardingStore;
    std::function<void()> before;
    void commit(store::Batch b, std::function<void(store::Status)> done) override {
        if (auto f = std::exchange(before, nullptr)) f();
        done(write(std::move(b)));
    }
    store::Status write(store::Batch b) {
        std::promise<store::Status> p;
        auto f = p.get_future();
        inner_.commit(std::move(b), [&p](store::Status st) { p.set_value(std::move(st)); });
        return f.get();
    }
};

//! Counts each call the placement makes without the table's lock (`unlocked`).
class TableHost : public armada::testing::ScriptedTable<Placement::Host> {
  public:
    std::mutex mu;
    bool drains = false;
    std::vector<std::string> installed, resumed;
    std::vector<std::pair<std::string, std::string>> dropped;  // (id, error)
    int unlocked = 0;

    std::unique_lock<std::mutex> lock() override { return std::unique_lock(mu); }
    //! Whether some thread holds the lock: another thread tries to take it.
    bool held() {
        bool free = false;
        std::thread([&] {
            if (mu.try_lock()) {
                free = true;
                mu.unlock();
            }
        }).join();
        return !free;
    }
    std::vector<Session *> all_sessions() override {
        unlocked += !held();
        std::vector<Session *> out;
        for (auto & [id, s] : sessions)
            out.push_back(s.get());
        return out;
    }
    bool draining() const override { return drains; }
    void install(std::unique_ptr<Session> s) override {
        unlocked += !held();
        installed.push_back(s->id);
        const std::string id = s->id;
        sessions[id] = std::move(s);
    }
    void drop(Session & s, const std::string & error) override {
        unlocked += !held();
        const std::string id = s.id;
        dropped.emplace_back(id, error);
        sessions.erase(id);
    }
    void resume(Session & s) override {
        unlocked += !held();
        resumed.push_back(s.id);
    }
};

//! The session log's host: the same table, whose handlers run with its lock held; a refused
//! write stops the session, as in the manager.
class LogHost : public SessionLog::Host {
  public:
    explicit LogHost(TableHost & table) : table_(table) {}
    Placement * placement = nullptr;
    void later(int ms, std::function<void()> fn) override {
        table_.later(ms, [this, fn = std::move(fn)] {
            auto lk = table_.lock();
            fn();
        });
    }
    Session * session(const std::string & id) override { return table_.session(id); }
    void later_unlocked(int ms, std::function<void()> fn) override { table_.later(ms, std::move(fn)); }
    void fenced(Session & s, const std::string & why) override { placement->drop_fenced(s, why); }
    void written(Session &) override {}

  private:
    TableHost & table_;
};

class RecordingEngine : public GenerationPort {
  public:
    std::vector<std::pair<std::string, bool>> released;  // (session, drop)
    int wakes = 0;
    std::map<std::string, engine::KvUsage> usage;
    engine::SubmitStatus submit(std::unique_ptr<engine::GenRequest>) override { return engine::SubmitStatus::Stopped; }
    void wake() override { ++wakes; }
    int32_t n_ctx_seq() const override { return 0; }
    void release(const std::string & session, bool drop) override { released.emplace_back(session, drop); }
    std::optional<engine::KvUsage> kv_usage(const std::string & session) const override {
        auto it = usage.find(session);
        if (it == usage.end()) return std::nullopt;
        return it->second;
    }
    uint64_t kv_bytes_per_token() const override { return 1000; }
};

class FixedClock : public Clock {
  public:
    int64_t ms = 1'000'000;
    int64_t now_ms() const override { return ms; }
};

const char * kTrace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

class PlacementTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ =
            std::filesystem::temp_directory_path() / ("armada-placement-" + std::to_string(::getpid()) + "-" +
                                                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::remove_all(dir_);
        std::string err;
        sqlite_ = store::SqliteStore::open(dir_.string(), err);
        ASSERT_TRUE(sqlite_) << err;
        store_ = std::make_unique<SyncCommits>(*sqlite_);
    }
    void TearDown() override {
        EXPECT_EQ(table_.unlocked, 0) << "calls to the table without its lock";
        placement_.reset();
        log_.reset();
        agents_.reset();
        store_.reset();
        sqlite_.reset();
        std::filesystem::remove_all(dir_);
    }

    //! The placement of node `node` (empty: a single node) of cell c1.
    Placement & make(const std::string & node) {
        agents_ = std::make_unique<AgentRegistry>(*store_, clock_, !node.empty());
        AgentSpec spec;
        spec.id = "helper";
        agents_->put_operator(spec);
        log_ = std::make_unique<SessionLog>(log_host_, *store_, metrics_, clock_, alive_,
                                            SessionLog::Options{node, node.empty() ? "" : "c1"});
        placement_ = std::make_unique<Placement>(table_, *store_, engine_, *log_, *agents_, metrics_, clock_,
                                                 Placement::Options{node, node.empty() ? "" : "c1"});
        log_host_.placement = placement_.get();
        return *placement_;
    }

    //! A session in the store: its first step, then `extra` steps; assigned to `node` under
    //! `epoch` when `node` is given.
    void seed(const std::string & id, const std::string & state, const std::string & node = "", int64_t epoch = 0,
              const std::vector<std::pair<std::string, json>> & extra = {}, const std::string & agent = "helper",
              const std::string & data = "{}") {
        store::Batch b;
        store::SessionRecord r;
        r.id = id;
        r.agent_id = agent;
        r.owner = "t1";
        r.state = state;
        r.data = data;
        r.created_ms = r.updated_ms = clock_.ms;
        r.cell = node.empty() ? "" : "c1";
        b.sessions.push_back(r);
        int64_t seq = 0;
        b.steps.push_back(step(id, ++seq, "user_input", {{"content", "hello"}}));
        for (const auto & [kind, payload] : extra)
            b.steps.push_back(step(id, ++seq, kind, payload, kind == "tool_call" ? id + ":1:0" : ""));
        if (!node.empty()) b.assign.push_back({id, node, epoch, "c1"});
        ASSERT_TRUE(store_->write(std::move(b)).ok);
    }
    //! Another node's brain moves `id` to `node` under `epoch`.
    void reassign(const std::string & id, const std::string & node, int64_t epoch) {
        store::Batch b;
        b.assign.push_back({id, node, epoch, "c1"});
        ASSERT_TRUE(store_->write(std::move(b)).ok);
    }
    static store::StepRecord step(const std::string & id, int64_t seq, const std::string & kind, const json & payload,
                                  const std::string & key = {}) {
        store::StepRecord r;
        r.session_id = id;
        r.seq = seq;
        r.kind = kind;
        r.payload = payload.dump();
        r.idempotency = key;
        r.ts_ms = 1;
        return r;
    }
    Session & in_table(const std::string & id) {
        Session * s = table_.session(id);
        if (!s) throw std::runtime_error(id + " is not in the table");
        return *s;
    }
    static std::set<std::string> as_set(const std::vector<std::string> & v) { return {v.begin(), v.end()}; }

    std::filesystem::path dir_;
    std::unique_ptr<store::SqliteStore> sqlite_;
    std::unique_ptr<SyncCommits> store_;
    TableHost table_;
    LogHost log_host_{table_};
    RecordingEngine engine_;
    FixedClock clock_;
    obs::Registry metrics_;
    std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
    std::unique_ptr<AgentRegistry> agents_;
    std::unique_ptr<SessionLog> log_;
    std::unique_ptr<Placement> placement_;
};

TEST_F(PlacementTest, ResumeAllOnOneNodeTakesEachOpenSessionOnce) {
    seed("sess_q", "queued");
    seed("sess_w", "waiting_tool", "", 0,
         {{"model_output", {{"step", 1}, {"content", ""}}}, {"tool_call", {{"id", "c1"}, {"name", "search"}}}});
    seed("sess_done", "completed");
    seed("sess_resp", "queued", "", 0, {}, "@response");
    Placement & p = make("");
    EXPECT_EQ(p.resume_all(), 2u);
    EXPECT_EQ(as_set(table_.resumed), (std::set<std::string>{"sess_q", "sess_w"}));
    Session & w = in_table("sess_w");
    EXPECT_TRUE(w.place.started);
    ASSERT_NE(w.agent, nullptr);
    EXPECT_EQ(w.agent->id, "helper");
    ASSERT_EQ(w.tools.calls.size(), 1u);  // rebuilt from its log: the call not yet answered
    EXPECT_FALSE(w.tools.calls[0].done);
    // A second pass finds them in the table already.
    EXPECT_EQ(p.resume_all(), 0u);
    EXPECT_EQ(table_.installed.size(), 2u);
}

TEST_F(PlacementTest, ResumeAllInACellTakesOnlyThisNodesSessions) {
    seed("sess_mine", "running", "n1", 4);
    seed("sess_theirs", "running", "n2", 1);
    seed("sess_unplaced", "queued");
    Placement & p = make("n1");
    EXPECT_EQ(p.resume_all(), 1u);
    EXPECT_EQ(table_.resumed, std::vector<std::string>{"sess_mine"});
    EXPECT_EQ(in_table("sess_mine").place.epoch, 4);
}

TEST_F(PlacementTest, AdoptRunsASessionOnlyAsTheStoreAssignsIt) {
    seed("sess_a", "queued", "n1", 2);
    seed("sess_b", "queued", "n2", 2);
    seed("sess_c", "completed", "n1", 1);
    Placement & p = make("n1");
    EXPECT_FALSE(p.adopt("sess_a", 1, std::nullopt, std::nullopt));  // a late command: the store is at 2
    EXPECT_FALSE(p.adopt("sess_b", 2, std::nullopt, std::nullopt));  // another node's
    EXPECT_FALSE(p.adopt("sess_c", 1, std::nullopt, std::nullopt));  // ended
    EXPECT_TRUE(table_.installed.empty());
    EXPECT_TRUE(p.adopt("sess_a", 2, std::nullopt, std::nullopt));
    EXPECT_EQ(table_.resumed, std::vector<std::string>{"sess_a"});
    // A repeated command finds it running: it is neither loaded nor started again.
    EXPECT_TRUE(p.adopt("sess_a", 2, std::nullopt, std::nullopt));
    EXPECT_EQ(table_.installed.size(), 1u);
    EXPECT_EQ(table_.resumed.size(), 1u);
}

TEST_F(PlacementTest, AdoptReplacesACopyThatOnlyStreamedAndStopsItsGeneration) {
    seed("sess_a", "queued", "n1", 3);
    Placement & p = make("n1");
    auto old = std::make_unique<Session>();
    old->id = "sess_a";
    old->gen.id = 7;
    old->gen.cancel = std::make_shared<std::atomic<bool>>(false);
    auto cancel = old->gen.cancel;
    table_.sessions["sess_a"] = std::move(old);  // loaded to be read: not started
    EXPECT_TRUE(p.adopt("sess_a", 3, std::nullopt, std::nullopt));
    EXPECT_TRUE(cancel->load());
    EXPECT_EQ(engine_.wakes, 1);
    Session & now = in_table("sess_a");
    EXPECT_EQ(now.gen.id, 8);  // late engine events of the old copy are ignored
    EXPECT_TRUE(now.place.started);
    EXPECT_EQ(table_.installed, std::vector<std::string>{"sess_a"});
}

TEST_F(PlacementTest, AMoveIsWrittenUnderTheNewEpochBeforeTheSessionGoesOn) {
    seed("sess_a", "waiting_tool", "n1", 3);
    Placement & p = make("n1");
    MoveNote note;
    note.from = "n0";
    note.kv_source = "transfer";
    note.bytes = 4096;
    note.tokens = 12;
    EXPECT_TRUE(p.adopt("sess_a", 3, std::nullopt, note));
    EXPECT_TRUE(table_.resumed.empty()) << "it waits for its move to be durable";
    table_.run_all_timers();
    EXPECT_EQ(table_.resumed, std::vector<std::string>{"sess_a"});
    const auto steps = sqlite_->steps("sess_a");
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_EQ(steps[1].kind, "moved");
    const json d = json::parse(steps[1].payload);
    EXPECT_EQ(d["from"], "n0");
    EXPECT_EQ(d["to"], "n1");
    EXPECT_EQ(d["epoch"], 3);
    EXPECT_EQ(d["kv_source"], "transfer");
    EXPECT_EQ(d["bytes"], 4096);
}

TEST_F(PlacementTest, AMoveFencedByANewerAssignmentStopsTheSessionHere) {
    seed("sess_a", "waiting_tool", "n1", 3);
    Placement & p = make("n1");
    MoveNote note;
    note.from = "n0";
    note.kv_source = "none";
    // The brain moves it on again before the move is written.
    store_->before = [&] { reassign("sess_a", "n2", 4); };
    EXPECT_TRUE(p.adopt("sess_a", 3, std::nullopt, note));
    table_.run_all_timers();
    EXPECT_TRUE(table_.resumed.empty());
    ASSERT_EQ(table_.dropped.size(), 1u);
    EXPECT_EQ(table_.dropped[0].first, "sess_a");
    EXPECT_EQ(table_.dropped[0].second, "fenced: another node holds the session now");
    ASSERT_EQ(engine_.released.size(), 1u);
    EXPECT_EQ(engine_.released[0], std::make_pair(std::string("sess_a"), true));  // its KV is of no use here
    EXPECT_EQ(p.fenced(), 1u);
    EXPECT_EQ(sqlite_->steps("sess_a").size(), 1u);  // nothing of the move was written
}

TEST_F(PlacementTest, AdoptAssignedTakesUpOnlyAssignmentsSeenByTheCallBefore) {
    seed("sess_a", "queued", "n1", 1);
    seed("sess_b", "waiting_tool", "n1", 2);
    seed("sess_incoming", "queued", "n1", 2);
    Placement & p = make("n1");
    p.incoming("sess_incoming", true);  // its KV is on its way
    // The first call takes up every assignment not running here.
    EXPECT_EQ(p.adopt_assigned(), 2u);
    EXPECT_EQ(as_set(table_.installed), (std::set<std::string>{"sess_a", "sess_b"}));
    table_.run_all_timers();
    // Past its first assignment, a session taken up without its command says so in its log.
    const auto b_steps = sqlite_->steps("sess_b");
    ASSERT_EQ(b_steps.size(), 2u);
    EXPECT_EQ(b_steps[1].kind, "moved");
    EXPECT_EQ(json::parse(b_steps[1].payload)["kv_source"], "none");
    EXPECT_EQ(sqlite_->steps("sess_a").size(), 1u);
    // A fresh assignment is the command's to carry out: only the next call takes it up.
    seed("sess_c", "queued", "n1", 1);
    EXPECT_EQ(p.adopt_assigned(), 0u);
    EXPECT_EQ(p.adopt_assigned(), 1u);
    EXPECT_TRUE(table_.session("sess_c"));
    EXPECT_FALSE(table_.session("sess_incoming"));
    // Draining, it takes up nothing.
    seed("sess_d", "queued", "n1", 1);
    table_.drains = true;
    EXPECT_EQ(p.adopt_assigned(), 0u);
    EXPECT_EQ(p.adopt_assigned(), 0u);
    EXPECT_FALSE(table_.session("sess_d"));
}

TEST_F(PlacementTest, AdoptAssignedStopsIdleSessionsTheStoreGaveToAnotherNode) {
    seed("sess_idle", "waiting_input", "n1", 1);
    seed("sess_busy", "waiting_tool", "n1", 1);
    seed("sess_kept", "waiting_input", "n1", 1);
    Placement & p = make("n1");
    EXPECT_EQ(p.adopt_assigned(), 3u);
    in_table("sess_busy").tools.in_flight = 1;  // its next write is fenced; it stops then
    reassign("sess_idle", "n2", 2);
    reassign("sess_busy", "n2", 2);
    EXPECT_EQ(p.adopt_assigned(), 0u);
    ASSERT_EQ(table_.dropped.size(), 1u);
    EXPECT_EQ(table_.dropped[0].first, "sess_idle");
    EXPECT_EQ(table_.dropped[0].second, "fenced: another node holds the session now");
    EXPECT_TRUE(table_.session("sess_busy"));
    EXPECT_TRUE(table_.session("sess_kept"));
}

TEST_F(PlacementTest, AFencedSessionAnswersItsWaitingCallersAndAnOfferedOneIsHandedOn) {
    Placement & p = make("n1");
    std::vector<int> statuses;
    for (const char * id : {"sess_fenced", "sess_offered"}) {
        auto s = std::make_unique<Session>();
        s->id = id;
        s->place.started = true;
        s->log.outbox.push_back({{}, {}, {}, [&](Outcome o) { statuses.push_back(o.status); }});
        table_.sessions[id] = std::move(s);
    }
    in_table("sess_offered").place.leaving_ms = clock_.ms;
    {
        auto lk = table_.lock();  // as the session log calls it
        p.drop_fenced(in_table("sess_fenced"), "refused");
        p.drop_fenced(in_table("sess_offered"), "refused");
    }
    EXPECT_EQ(statuses, (std::vector<int>{409, 409}));
    ASSERT_EQ(table_.dropped.size(), 2u);
    EXPECT_EQ(table_.dropped[0].second, "fenced: another node holds the session now");
    EXPECT_EQ(table_.dropped[1].second, "");  // handed on: the next node goes on with its turn
    // An offered session's KV journal stays until the node that took it has fetched it.
    EXPECT_EQ(engine_.released,
              (std::vector<std::pair<std::string, bool>>{{"sess_fenced", true}, {"sess_offered", false}}));
    EXPECT_EQ(p.fenced(), 2u);
}

TEST_F(PlacementTest, OfferToMovePicksSessionsWaitingForToolsThenTheLargestKv) {
    const std::vector<std::pair<std::string, json>> out = {{"model_output", {{"step", 1}, {"kv_tokens", 100}}}};
    seed("sess_tool", "waiting_tool", "n1", 1, {{"model_output", {{"step", 1}, {"kv_tokens", 10}}}});
    seed("sess_big", "running", "n1", 1, {{"model_output", {{"step", 1}, {"kv_tokens", 500}}}});
    seed("sess_small", "running", "n1", 1, out);
    seed("sess_input", "waiting_input", "n1", 1, {{"model_output", {{"step", 1}, {"kv_tokens", 900}}}});
    seed("sess_incoming", "running", "n1", 1, {{"model_output", {{"step", 1}, {"kv_tokens", 800}}}});
    Placement & p = make("n1");
    EXPECT_EQ(p.adopt_assigned(), 5u);
    table_.run_all_timers();
    p.incoming("sess_incoming", true);
    EXPECT_EQ(p.offer_to_move(2), 2u);
    std::set<std::string> offered;
    for (auto & [id, s] : table_.sessions)
        if (s->place.leaving_ms > 0) offered.insert(id);
    EXPECT_EQ(offered, (std::set<std::string>{"sess_tool", "sess_big"}));
    // What it offers the brain, with the most each KV journal can be.
    engine_.usage["sess_big"] = {"slot", 500, 1'000'000, 0};
    in_table("sess_big").trace.last = obs::TraceContext::parse(kTrace);
    auto m = p.movable();
    std::sort(m.begin(), m.end(), [](const Movable & a, const Movable & b) { return a.id < b.id; });
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0].id, "sess_big");
    EXPECT_EQ(m[0].epoch, 1);
    EXPECT_EQ(m[0].kv_bytes, 2 * 1'000'000u + 500u * 64 + (1u << 20));
    ASSERT_TRUE(m[0].trace);  // the trace of its last turn, as this node holds it
    EXPECT_EQ(m[0].trace->traceparent(), kTrace);
    EXPECT_EQ(m[1].id, "sess_tool");
    EXPECT_EQ(m[1].kv_bytes, 0u);  // no KV here
    // Draining, the manager offers every session itself: nothing is picked.
    table_.drains = true;
    EXPECT_EQ(p.offer_to_move(5), 0u);
}

TEST_F(PlacementTest, AnOfferNoNodeTookIsWithdrawnUnderTheNextEpoch) {
    seed("sess_a", "waiting_tool", "n1", 1);
    Placement & p = make("n1");
    EXPECT_EQ(p.adopt_assigned(), 1u);
    ASSERT_EQ(p.offer_to_move(1), 1u);
    table_.resumed.clear();
    clock_.ms += 4000;
    EXPECT_EQ(p.stay_unmoved(5000), 0u);  // not yet
    clock_.ms += 1000;
    EXPECT_EQ(p.stay_unmoved(5000), 1u);
    EXPECT_TRUE(table_.resumed.empty()) << "it goes on only once the claim is durable";
    table_.run_all_timers();
    Session & s = in_table("sess_a");
    EXPECT_EQ(s.place.leaving_ms, 0);
    EXPECT_EQ(s.place.epoch, 2);
    EXPECT_EQ(table_.resumed, std::vector<std::string>{"sess_a"});
    EXPECT_EQ(sqlite_->session("sess_a")->epoch, 2);
    EXPECT_EQ(sqlite_->session("sess_a")->node, "n1");
}

TEST_F(PlacementTest, DrainingItOffersEveryOpenSessionTheStoreGivesThisNode) {
    seed("sess_a", "waiting_input", "n1", 2, {}, "helper", json{{"traceparent", kTrace}}.dump());
    seed("sess_b", "queued", "n1", 1);
    seed("sess_c", "queued", "n2", 1);
    seed("sess_busy", "running", "n1", 1);
    Placement & p = make("n1");
    EXPECT_TRUE(p.adopt("sess_busy", 1, std::nullopt, std::nullopt));
    in_table("sess_busy").tools.in_flight = 1;
    table_.drains = true;
    auto m = p.movable();
    std::sort(m.begin(), m.end(), [](const Movable & a, const Movable & b) { return a.id < b.id; });
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0].id, "sess_a");
    EXPECT_EQ(m[0].epoch, 2);
    ASSERT_TRUE(m[0].trace);  // from its row: the brain continues its trace
    EXPECT_EQ(m[0].trace->traceparent(), kTrace);
    EXPECT_EQ(m[1].id, "sess_b");
    EXPECT_FALSE(m[1].trace);
}

TEST_F(PlacementTest, ACommandUnderTheNextEpochMovesTheRunningCopyOn) {
    seed("sess_a", "running", "n1", 1);
    Placement & p = make("n1");
    EXPECT_TRUE(p.adopt("sess_a", 1, std::nullopt, std::nullopt));
    reassign("sess_a", "n1", 2);  // a move that brought it back here before it left
    EXPECT_TRUE(p.adopt("sess_a", 2, std::nullopt, std::nullopt));
    EXPECT_EQ(table_.installed.size(), 1u);  // the copy running here goes on
    EXPECT_EQ(table_.resumed.size(), 1u);
    EXPECT_EQ(in_table("sess_a").place.epoch, 2);  // and writes under the new epoch
}

TEST_F(PlacementTest, ACopyThatRanHereBeforeTheSessionMovedAwayIsReplacedFromTheStore) {
    seed("sess_a", "running", "n1", 1);
    Placement & p = make("n1");
    EXPECT_TRUE(p.adopt("sess_a", 1, std::nullopt, std::nullopt));
    in_table("sess_a").gen.id = 5;
    reassign("sess_a", "n2", 2);
    reassign("sess_a", "n1", 3);  // it ran on n2 meanwhile: the store is newer than this copy
    EXPECT_TRUE(p.adopt("sess_a", 3, std::nullopt, std::nullopt));
    EXPECT_EQ(table_.installed.size(), 2u);
    EXPECT_EQ(table_.resumed.size(), 2u);
    EXPECT_EQ(in_table("sess_a").place.epoch, 3);
    EXPECT_EQ(in_table("sess_a").gen.id, 6);
}

TEST_F(PlacementTest, AnOfferTheBrainTookFirstIsHandedOnNotClaimedBack) {
    seed("sess_a", "waiting_tool", "n1", 1);
    Placement & p = make("n1");
    EXPECT_EQ(p.adopt_assigned(), 1u);
    ASSERT_EQ(p.offer_to_move(1), 1u);
    reassign("sess_a", "n2", 2);  // the brain moved it before the offer ran out
    clock_.ms += 5000;
    EXPECT_EQ(p.stay_unmoved(5000), 1u);
    table_.run_all_timers();
    ASSERT_EQ(table_.dropped.size(), 1u);
    EXPECT_EQ(table_.dropped[0], std::make_pair(std::string("sess_a"), std::string()));
    EXPECT_EQ(engine_.released, (std::vector<std::pair<std::string, bool>>{{"sess_a", false}}));
    EXPECT_EQ(sqlite_->session("sess_a")->node, "n2");
}

TEST_F(PlacementTest, OpenHereAndHeldElsewhereReadTheStore) {
    seed("sess_a", "queued", "n1", 1);
    seed("sess_b", "queued", "n2", 1);
    seed("sess_c", "completed", "n1", 1);
    Placement & p = make("n1");
    EXPECT_EQ(p.open_here(), 1u);
    EXPECT_EQ(p.held_elsewhere("sess_b"), true);
    EXPECT_EQ(p.held_elsewhere("sess_a"), false);
    EXPECT_EQ(p.held_elsewhere("sess_none"), false);
    // A node the store gives nothing: none, read (not "cannot be read").
    EXPECT_EQ(make("n3").open_here(), 0u);
}

}  // namespace

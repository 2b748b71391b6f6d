// The cell runner over its seams' fakes: an in-memory etcd, an in-memory bus, a SQLite store and
// a clock the test moves. The same code runs in `armada cell`.

#include "cluster/runtime/cell_runner.h"
#include "cluster/membership.h"
#include "cluster/queue.h"
#include "cluster/runtime/elected.h"
#include "store/sqlite_store.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

using namespace armada;
using namespace armada::cluster;
using json = nlohmann::json;

namespace {

//! A term the test ends by hand; its store mark is a real leader-fenced probe batch.
class FakeTerm final : public Leadership {
  public:
    FakeTerm(std::string election, int64_t rev) : election_(std::move(election)) {
        me_.key = election_ + "/k" + std::to_string(rev);
        me_.rev = rev;
    }
    const EtcdLeader & me() const override { return me_; }
    int64_t lease() const override { return 0; }
    void beat() override { ++beats; }
    bool still_leader() override { return leads; }
    bool claim_store(store::Store & st) override { return mark_leader(st, election_, me_.rev).ok; }
    bool wait_stop(int) override { return false; }
    bool leads = true;
    int beats = 0;

  private:
    std::string election_;
    EtcdLeader me_;
};

class CellRunnerTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ =
            std::filesystem::temp_directory_path() / ("armada-cell-runner-" + std::to_string(::getpid()) + "-" +
                                                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::remove_all(dir_);
        std::string err;
        store_ = store::SqliteStore::open(dir_.string(), err);
        ASSERT_TRUE(store_) << err;
        places_ = bus_.inbox(place_subject("c1"));
        events_ = bus_.inbox(event_subject("c1"));
        CellRunnerConfig cfg;
        cfg.cell = "c1";
        cfg.fetch_wait_ms = 0;
        runner_ = std::make_unique<CellRunner>(cfg, kv_, bus_, *places_, *events_, *store_, clock_, metrics_);
    }
    void TearDown() override {
        runner_.reset();
        store_.reset();
        std::filesystem::remove_all(dir_);
    }
    //! A node of cell c1 with room, under a lease of its own; returns the lease.
    int64_t node_up(const std::string & name, int free = 8) {
        const int64_t lease = kv_.grant();
        NodeLoad l;
        l.node = name;
        l.free_seqs = free;
        l.kv_headroom = 1 << 30;
        l.url = "http://" + name;
        EXPECT_EQ(kv_.put(keys_.node("c1", name), encode_load(l), lease), "");
        return lease;
    }
    void session_row(const std::string & id, const std::string & node = {}, int64_t epoch = 0) {
        store::Batch b;
        store::SessionRecord r;
        r.id = id;
        r.agent_id = "a";
        r.state = "idle";
        r.cell = "c1";
        b.sessions.push_back(r);
        if (!node.empty()) b.assign.push_back({id, node, epoch});
        ASSERT_TRUE(store_->commit_sync(std::move(b)).ok);
    }
    //! The run commands sent so far: node → sessions.
    std::map<std::string, std::vector<json>> commands() const {
        std::map<std::string, std::vector<json>> out;
        const std::string pre = command_subject("");
        for (const auto & [subject, data] : bus_.sent_kept())
            if (subject.rfind(pre, 0) == 0) out[subject.substr(pre.size())].push_back(json::parse(data));
        return out;
    }

    std::filesystem::path dir_;
    MemoryKv kv_;
    MemoryBus bus_;
    ManualClock clock_;
    obs::Registry metrics_;
    ClusterKeys keys_{"/armada"};
    std::unique_ptr<store::SqliteStore> store_;
    std::unique_ptr<Inbox> places_, events_;
    std::unique_ptr<CellRunner> runner_;
    FakeTerm term_{"/armada/cells/c1/brain", 10};
};

}  // namespace

TEST_F(CellRunnerTest, PlacesARequestedSessionWritesItsAssignmentAndSendsTheRunCommand) {
    node_up("n1", 2);
    node_up("n2", 8);
    session_row("s1");
    ASSERT_EQ(bus_.publish_async(place_subject("c1"), R"({"session":"s1"})", "s1"), "");
    ASSERT_TRUE(runner_->begin(term_));
    ASSERT_TRUE(runner_->turn(term_));
    const auto row = store_->session("s1");
    ASSERT_TRUE(row);
    EXPECT_EQ(row->node, "n2") << "the node with the most room";
    EXPECT_EQ(row->epoch, 1);
    const auto cmds = commands();
    ASSERT_EQ(cmds.count("n2"), 1u);
    EXPECT_EQ(cmds.at("n2").at(0)["op"], "run");
    EXPECT_EQ(cmds.at("n2").at(0)["session"], "s1");
    EXPECT_EQ(bus_.waiting(place_subject("c1")), 0u) << "the request was acked";
    EXPECT_GT(term_.beats, 0);
}

TEST_F(CellRunnerTest, ANodeWhoseLeaseGoesHasItsSessionsMovedToALiveNode) {
    const int64_t l1 = node_up("n1");
    node_up("n2");
    session_row("s1", "n1", 1);
    session_row("s2", "n1", 1);
    ASSERT_TRUE(runner_->begin(term_));
    ASSERT_TRUE(runner_->turn(term_));
    EXPECT_TRUE(commands().empty()) << "sessions on a live node stay";
    kv_.revoke(l1);
    clock_.advance(100);
    ASSERT_TRUE(runner_->turn(term_));
    for (const char * id : {"s1", "s2"}) {
        const auto row = store_->session(id);
        ASSERT_TRUE(row);
        EXPECT_EQ(row->node, "n2") << id;
        EXPECT_EQ(row->epoch, 2) << id;
    }
    const auto cmds = commands();
    ASSERT_EQ(cmds.count("n2"), 1u);
    ASSERT_EQ(cmds.at("n2").size(), 2u);
    EXPECT_EQ(cmds.at("n2")[0]["left"], "n1");
    // The failover is in the cell's next report.
    clock_.advance(1000);
    ASSERT_TRUE(runner_->turn(term_));
    std::optional<EtcdKv> rep;
    ASSERT_EQ(kv_.get(keys_.cell_report("c1"), rep), "");
    ASSERT_TRUE(rep);
    const auto r = decode_cell_report("c1", rep->value);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->failovers.size(), 1u);
    EXPECT_EQ(r->failovers[0].node, "n1");
}

TEST_F(CellRunnerTest, WhileEtcdIsAwayNothingMovesAndTheViewIsRebuiltWhenItIsBack) {
    node_up("n1");
    node_up("n2");
    session_row("s1", "n1", 1);
    ASSERT_TRUE(runner_->begin(term_));
    ASSERT_TRUE(runner_->turn(term_));
    kv_.set_down(true);
    const int64_t failures = runner_->reconcile_failures();
    for (int i = 0; i < 10; ++i) {
        clock_.advance(3000);
        ASSERT_TRUE(runner_->turn(term_));
    }
    (void)failures;
    EXPECT_EQ(runner_->brain()->live_nodes().size(), 2u) << "an etcd that cannot be read is not every node gone";
    EXPECT_TRUE(commands().empty()) << "an etcd outage is not a lost node";
    kv_.set_down(false);
    clock_.advance(5000);
    ASSERT_TRUE(runner_->turn(term_));
    EXPECT_TRUE(commands().empty());
    EXPECT_EQ(store_->session("s1")->node, "n1");
}

TEST_F(CellRunnerTest, ANewerLeadersMarkEndsTheTermAtItsNextWrite) {
    node_up("n1");
    ASSERT_TRUE(runner_->begin(term_));
    ASSERT_TRUE(runner_->turn(term_));
    FakeTerm newer("/armada/cells/c1/brain", 11);
    ASSERT_TRUE(newer.claim_store(*store_));
    session_row("s1");
    ASSERT_EQ(bus_.publish_async(place_subject("c1"), R"({"session":"s1"})", "s1"), "");
    EXPECT_FALSE(runner_->turn(term_)) << "the deposed brain stops leading";
    EXPECT_TRUE(commands().empty()) << "and sends nothing";
}

TEST_F(CellRunnerTest, ATermThatNoLongerLeadsEndsAtItsNextCheck) {
    node_up("n1");
    ASSERT_TRUE(runner_->begin(term_));
    ASSERT_TRUE(runner_->turn(term_));
    term_.leads = false;
    clock_.advance(1000);
    EXPECT_FALSE(runner_->turn(term_));
    runner_->end();
    EXPECT_EQ(runner_->brain(), nullptr);
}

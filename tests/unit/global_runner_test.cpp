// The global runner over its seams' fakes: an in-memory etcd, an in-memory bus, a SQLite store and
// a clock the test moves. The same code runs in `armada global`.

#include "cluster/runtime/global_runner.h"
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

class Term final : public Leadership {
  public:
    explicit Term(int64_t rev) {
        me_.key = "/armada/global/brain/k";
        me_.rev = rev;
    }
    const EtcdLeader & me() const override { return me_; }
    int64_t lease() const override { return 0; }
    void beat() override {}
    bool still_leader() override { return true; }
    bool claim_store(store::Store & st) override { return mark_leader(st, "/armada/global/brain", me_.rev).ok; }
    bool wait_stop(int) override { return false; }

  private:
    EtcdLeader me_;
};

class GlobalRunnerTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ =
            std::filesystem::temp_directory_path() / ("armada-global-runner-" + std::to_string(::getpid()) + "-" +
                                                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::remove_all(dir_);
        std::string err;
        store_ = store::SqliteStore::open(dir_.string(), err);
        ASSERT_TRUE(store_) << err;
        GlobalRunnerConfig cfg;
        cfg.cells = {{"c1", "", 0.57}, {"c2", "", 0.57}};
        runner_ = std::make_unique<GlobalRunner>(cfg, kv_, bus_, *store_, clock_, metrics_);
    }
    void TearDown() override {
        runner_.reset();
        store_.reset();
        std::filesystem::remove_all(dir_);
    }
    //! A node of `cell` under a lease of its own (its lease).
    int64_t node(const std::string & cell, const std::string & name) {
        const int64_t lease = kv_.grant();
        NodeLoad l;
        l.node = name;
        l.free_seqs = 64;
        l.kv_headroom = 1ll << 32;
        l.url = "http://" + name;
        EXPECT_EQ(kv_.put(keys_.node(cell, name), encode_load(l), lease), "");
        return lease;
    }
    //! `cell`'s brain reports (under `lease`), with `n` nodes of room.
    void report(const std::string & cell, int64_t lease) {
        std::vector<NodeLoad> loads;
        NodeLoad l;
        l.node = cell + "-n";
        l.free_seqs = 64;
        l.kv_headroom = 1ll << 32;
        loads.push_back(l);
        EXPECT_EQ(kv_.put(keys_.cell_report(cell), encode_cell_report(cell_report(cell, loads, {})), lease), "");
    }
    void session_row(const std::string & id, const std::string & cell, const std::string & node, int64_t epoch) {
        store::Batch b;
        store::SessionRecord r;
        r.id = id;
        r.agent_id = "a";
        r.state = "idle";
        r.cell = cell;
        b.sessions.push_back(r);
        b.assign.push_back({id, node, epoch});
        ASSERT_TRUE(store_->commit_sync(std::move(b)).ok);
    }
    //! Turns of one second each for `seconds`, with both cells' brains reporting when told to.
    void run_for(int seconds, const std::function<void()> & each = {}) {
        for (int i = 0; i < seconds; ++i) {
            if (each) each();
            ASSERT_TRUE(runner_->turn(term_));
            clock_.advance(1000);
        }
    }
    std::vector<std::pair<std::string, json>> place_requests() const {
        std::vector<std::pair<std::string, json>> out;
        const std::string pre = place_subject("");
        for (const auto & [subject, data] : bus_.sent_kept())
            if (subject.rfind(pre, 0) == 0) out.emplace_back(subject.substr(pre.size()), json::parse(data));
        return out;
    }

    std::filesystem::path dir_;
    MemoryKv kv_;
    MemoryBus bus_;
    ManualClock clock_;
    obs::Registry metrics_;
    ClusterKeys keys_{"/armada"};
    std::unique_ptr<store::SqliteStore> store_;
    std::unique_ptr<GlobalRunner> runner_;
    Term term_{5};
};

}  // namespace

TEST_F(GlobalRunnerTest, ACellWhoseLeasesAreAllGoneHasItsOpenSessionsReHomed) {
    const int64_t b1 = kv_.grant(), b2 = kv_.grant();
    const int64_t n1 = node("c1", "n1");
    node("c2", "n2");
    session_row("s1", "c1", "n1", 3);
    session_row("s2", "c1", "n1", 1);
    ASSERT_TRUE(runner_->begin(term_));
    run_for(3, [&] {
        report("c1", b1);
        report("c2", b2);
    });
    EXPECT_TRUE(place_requests().empty());
    // c1's brain and node die: every lease of the cell goes.
    kv_.revoke(b1);
    kv_.revoke(n1);
    run_for(3, [&] { report("c2", b2); });
    for (const auto & [id, epoch] : std::map<std::string, int64_t>{{"s1", 4}, {"s2", 2}}) {
        const auto row = store_->session(id);
        ASSERT_TRUE(row);
        EXPECT_EQ(row->cell, "c2") << id;
        EXPECT_EQ(row->epoch, epoch) << id;
    }
    const auto reqs = place_requests();
    ASSERT_EQ(reqs.size(), 2u);
    for (const auto & [cell, body] : reqs)
        EXPECT_EQ(cell, "c2");
    EXPECT_EQ(runner_->rehomed(), 2);
}

TEST_F(GlobalRunnerTest, ACellThatStopsReportingWhileItsNodesLiveIsNotReHomed) {
    const int64_t b1 = kv_.grant(), b2 = kv_.grant();
    node("c1", "n1");
    node("c2", "n2");
    session_row("s1", "c1", "n1", 1);
    ASSERT_TRUE(runner_->begin(term_));
    run_for(3, [&] {
        report("c1", b1);
        report("c2", b2);
    });
    // c1's brain is stuck: its report stops changing (its lease still there), its node lives.
    run_for(60, [&] { report("c2", b2); });
    EXPECT_TRUE(place_requests().empty()) << "a silent cell is not a lost one";
    EXPECT_EQ(store_->session("s1")->cell, "c1");
    EXPECT_TRUE(runner_->brain()->stale("c1", clock_.now_ms())) << "it takes no new sessions";
    // And its brain's lease going too changes nothing while the node's lives.
    kv_.revoke(b1);
    run_for(20, [&] { report("c2", b2); });
    EXPECT_TRUE(place_requests().empty());
}

TEST_F(GlobalRunnerTest, WritesTheSplitOnceACellHasReportedAndExportsEtcdsSize) {
    const int64_t b1 = kv_.grant();
    node("c1", "n1");
    ASSERT_TRUE(runner_->begin(term_));
    run_for(1);
    std::optional<EtcdKv> shares;
    ASSERT_EQ(kv_.get(keys_.shares(), shares), "");
    EXPECT_FALSE(shares) << "nothing heard yet: no split";
    report("c1", b1);
    run_for(1);
    ASSERT_EQ(kv_.get(keys_.shares(), shares), "");
    ASSERT_TRUE(shares);
    const auto s = decode_shares(shares->value);
    ASSERT_TRUE(s);
    EXPECT_GT(s->weight.at("c1"), 0.99);
    EXPECT_NE(metrics_.render().find("armada_etcd_db_bytes"), std::string::npos);
    runner_->end();
    EXPECT_EQ(metrics_.render().find("armada_etcd_db_bytes"), std::string::npos) << "only a leader exports it";
}

TEST_F(GlobalRunnerTest, ChainSurvivalComesFromTheCellsReportsNotFromEveryEndedRow) {
    // The store holds ended rows the reports do not count: the global leader's figures are the
    // cells' own (each read by its brain), summed for the cluster.
    store::Batch b;
    for (int i = 0; i < 5; ++i) {
        store::SessionRecord r;
        r.id = "x" + std::to_string(i);
        r.agent_id = "a";
        r.state = "failed";
        r.cell = "c1";
        r.updated_ms = clock_.wall_ms();
        b.sessions.push_back(r);
    }
    ASSERT_TRUE(store_->commit_sync(std::move(b)).ok);
    const int64_t b1 = kv_.grant(), b2 = kv_.grant();
    node("c1", "n1");
    node("c2", "n2");
    const auto report_ended = [&](const std::string & cell, int64_t lease, std::map<std::string, int64_t> ended) {
        CellReport r = cell_report(cell, {}, {});
        r.ended = std::move(ended);
        EXPECT_EQ(kv_.put(keys_.cell_report(cell), encode_cell_report(r), lease), "");
    };
    report_ended("c1", b1, {{"completed", 9}, {"failed", 1}, {"timed_out", 0}, {"lost", 0}, {"cancelled", 2}});
    report_ended("c2", b2, {{"completed", 3}, {"failed", 0}, {"timed_out", 1}, {"lost", 0}, {"cancelled", 0}});
    ASSERT_TRUE(runner_->begin(term_));
    run_for(2);
    const std::string m = metrics_.render();
    const auto value = [&](const std::string & series) {
        const auto at = m.find("\n" + series + " ");
        EXPECT_NE(at, std::string::npos) << series << " in\n" << m;
        return at == std::string::npos ? -1.0 : std::stod(m.substr(at + series.size() + 2));
    };
    EXPECT_DOUBLE_EQ(value("armada_cell_chain_survival_ratio{cell=\"c1\"}"), 0.9);
    EXPECT_DOUBLE_EQ(value("armada_cell_chain_survival_ratio{cell=\"c2\"}"), 0.75);
    EXPECT_NEAR(value("armada_cluster_chain_survival_ratio"), 12.0 / 14.0, 1e-6);
    EXPECT_DOUBLE_EQ(value("armada_cluster_sessions_ended{outcome=\"cancelled\"}"), 2);
}

// The node agent over its seams' fakes: an in-memory bus and etcd, a clock the test moves, and
// sessions that record what they were asked. The same code runs in `armada serve --cluster`.

#include "cluster/runtime/node_agent.h"
#include "cluster/membership.h"
#include "cluster/queue.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace armada;
using namespace armada::cluster;
using json = nlohmann::json;

namespace {

class FakeSessions final : public NodeSessions {
  public:
    bool adopt(const std::string & id, int64_t epoch, const std::optional<obs::TraceContext> &,
               const std::optional<Arrived> & moved) override {
        adopted.push_back({id, epoch, moved});
        return epoch > 0;
    }
    void adopt_assigned() override { ++assigned_passes; }
    void incoming(const std::string & id, bool on) override { incoming_log.emplace_back(id, on); }
    std::vector<Movable> movable() override { return movable_now; }
    void offer_to_move(size_t n) override { offered_n += int(n); }
    void stay_unmoved(int64_t) override {}

    struct Adoption {
        std::string id;
        int64_t epoch;
        std::optional<Arrived> moved;
    };
    std::vector<Adoption> adopted;
    std::vector<std::pair<std::string, bool>> incoming_log;
    std::vector<Movable> movable_now;
    int assigned_passes = 0, offered_n = 0;
};

class NodeAgentTest : public ::testing::Test {
  protected:
    void SetUp() override {
        cmds_ = bus_.inbox(command_subject("n2"));
        NodeAgentConfig cfg;
        cfg.cell = "c1";
        cfg.node = "n2";
        agent_ = std::make_unique<NodeAgent>(
            cfg, kv_, bus_, *cmds_, sessions_, events_, clock_,
            [this](const std::string & session, const std::string & from, const std::string & url, uint64_t stated) {
                fetched.push_back({session, from, url, std::to_string(stated)});
                Arrived a;
                a.from = from;
                a.kv_source = url.empty() ? "none" : "transfer";
                return a;
            },
            [](const std::string & node, std::string & why) {
                if (node == "n1") return std::string("http://n1:8080");
                why = "no key";
                return std::string();
            });
    }
    void command(const std::string & body) { ASSERT_EQ(bus_.publish_async(command_subject("n2"), body, ""), ""); }

    MemoryBus bus_;
    MemoryKv kv_;
    ManualClock clock_;
    FakeSessions sessions_;
    std::shared_ptr<NodeEvents> events_ = std::make_shared<NodeEvents>("n2");
    std::unique_ptr<Inbox> cmds_;
    std::unique_ptr<NodeAgent> agent_;
    std::vector<std::vector<std::string>> fetched;
};

}  // namespace

TEST_F(NodeAgentTest, RunsAPlacementAndRecordsWhereAFailedOverSessionCameFrom) {
    command(R"({"op":"run","session":"s1","epoch":1})");
    command(R"({"op":"run","session":"s2","epoch":4,"left":"n9"})");
    agent_->command_turn(0);
    ASSERT_EQ(sessions_.adopted.size(), 2u);
    EXPECT_EQ(sessions_.adopted[0].id, "s1");
    EXPECT_FALSE(sessions_.adopted[0].moved);
    EXPECT_EQ(sessions_.adopted[1].epoch, 4);
    ASSERT_TRUE(sessions_.adopted[1].moved);
    EXPECT_EQ(sessions_.adopted[1].moved->from, "n9");
    EXPECT_EQ(sessions_.adopted[1].moved->kv_source, "none");
    EXPECT_EQ(agent_->commands(), 2u);
    EXPECT_EQ(bus_.waiting(command_subject("n2")), 0u) << "acked";
}

TEST_F(NodeAgentTest, AMoveFetchesTheKvFromALiveMemberBeforeTheSessionRunsHere) {
    command(R"({"op":"run","session":"s3","epoch":2,"from":"n1","kv_bytes":4096})");
    command(R"({"op":"run","session":"s4","epoch":2,"from":"gone"})");
    agent_->command_turn(0);
    EXPECT_TRUE(sessions_.adopted.empty()) << "not before its KV";
    EXPECT_EQ(agent_->arriving(), 2);
    ASSERT_TRUE(agent_->arrival_turn());
    ASSERT_TRUE(agent_->arrival_turn());
    ASSERT_EQ(fetched.size(), 2u);
    EXPECT_EQ(fetched[0], (std::vector<std::string>{"s3", "n1", "http://n1:8080", "4096"}));
    EXPECT_EQ(fetched[1][2], "") << "no URL for a node that is not a live member";
    ASSERT_EQ(sessions_.adopted.size(), 2u);
    EXPECT_EQ(sessions_.adopted[0].moved->kv_source, "transfer");
    EXPECT_EQ(sessions_.incoming_log,
              (std::vector<std::pair<std::string, bool>>{{"s3", true}, {"s4", true}, {"s3", false}, {"s4", false}}));
    EXPECT_EQ(agent_->arriving(), 0);
}

TEST_F(NodeAgentTest, AnyBytesInACommandAreAckedAndIgnoredWithoutHarm) {
    for (const char * bad :
         {"", "null", "[]", "{", R"({"op":1})", R"({"op":"run"})", R"({"op":"run","session":7,"epoch":1})",
          R"({"op":"run","session":"s","epoch":"1"})", R"({"op":"run","session":"s","epoch":1.5})",
          R"({"op":"run","session":"s","epoch":1,"from":3,"left":[]})",
          R"({"op":"run","session":"s","epoch":1,"traceparent":"junk"})", "\xff\xfe"}) {
        command(bad);
    }
    agent_->command_turn(0);
    EXPECT_EQ(bus_.waiting(command_subject("n2")), 0u);
    // Only the well-formed ones ran (a bad "from", "left" or trace is no move and no trace).
    ASSERT_EQ(sessions_.adopted.size(), 2u);
    for (const auto & a : sessions_.adopted) {
        EXPECT_EQ(a.id, "s");
        EXPECT_FALSE(a.moved);
    }
}

TEST_F(NodeAgentTest, AdoptsTheStoresAssignmentsOnceCommandsAreQuietAndSendsItsEvents) {
    agent_->command_turn(0);
    EXPECT_EQ(sessions_.assigned_passes, 0);
    clock_.advance(5001);
    agent_->command_turn(0);
    EXPECT_EQ(sessions_.assigned_passes, 1) << "the level-triggered pass";
    events_->ended("s1", "completed");
    EXPECT_TRUE(agent_->event_turn(0));
    const auto sent = bus_.sent_kept();
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].first, event_subject("c1"));
    EXPECT_EQ(json::parse(sent[0].second)["op"], "ended");
    // Draining, its movable sessions are offered to the brain each second.
    sessions_.movable_now = {{"s7", 3, std::nullopt, 100}};
    agent_->set_draining();
    clock_.advance(1001);
    agent_->command_turn(0);
    EXPECT_EQ(agent_->offered(), std::set<std::string>{"s7"});
    EXPECT_TRUE(agent_->event_turn(0));
    EXPECT_EQ(json::parse(bus_.sent_kept().back().second)["op"], "movable");
}

// The agent registry: who sees which agent, and how a node of a cluster follows the agents
// declared and deleted through other nodes (through the store).
#include "agent/agent_registry.h"
#include "store/memory_store.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace armada;
using agent::AgentRegistry;
using agent::AgentSpec;

namespace {

class StepClock : public agent::Clock {
  public:
    int64_t now_ms() const override { return now; }
    int64_t now = 1'000'000;
};

AgentSpec spec(const std::string & id, const std::string & tenant, const std::string & instructions = "x") {
    std::vector<AgentSpec> specs;
    const std::string text = R"({"id":")" + id + R"(","instructions":")" + instructions + R"("})";
    EXPECT_EQ(agent::parse_agents(text, specs), "");
    AgentSpec a = specs.at(0);
    a.tenant = tenant;
    return a;
}

// Stores an agent as a node's declaration does.
void store_agent(store::MemoryStore & st, const AgentSpec & a) {
    store::Batch b;
    b.agents.push_back({a.tenant, a.id, a.source, "", 1, 1});
    ASSERT_TRUE(st.commit_sync(std::move(b)).ok);
}

std::vector<std::string> ids(const std::vector<AgentSpec> & v) {
    std::vector<std::string> out;
    for (const auto & a : v)
        out.push_back(a.tenant + "/" + a.id);
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

TEST(AgentRegistry, TheOperatorsAgentShadowsATenantsAndATenantsShadowsAShared) {
    store::MemoryStore st;
    StepClock clock;
    AgentRegistry r(st, clock, false);
    r.put_operator(spec("ops", "", "operator"));
    r.put_declared(spec("ops", "t:a", "tenant"));
    r.put_declared(spec("mine", "t:a", "a's"));
    r.put_declared(spec("mine", agent::kSharedTenant, "shared"));
    EXPECT_TRUE(r.is_operator("ops"));
    EXPECT_FALSE(r.is_operator("mine"));
    EXPECT_EQ(r.lookup("t:a", "ops")->instructions, "operator");
    EXPECT_TRUE(r.lookup("t:a", "ops")->from_operator);
    EXPECT_EQ(r.lookup("t:a", "mine")->instructions, "a's");
    EXPECT_EQ(r.lookup("t:b", "mine")->instructions, "shared");
    EXPECT_EQ(r.lookup("t:b", "none"), nullptr);
    // a sees its own "mine", not the shared one it shadows; b sees the shared one.
    EXPECT_EQ(ids(r.visible("t:a", false)), (std::vector<std::string>{"/ops", "t:a/mine", "t:a/ops"}));
    EXPECT_EQ(ids(r.visible("t:b", false)), (std::vector<std::string>{"*/mine", "/ops"}));
    EXPECT_EQ(ids(r.visible("t:b", true)), (std::vector<std::string>{"*/mine", "/ops", "t:a/mine", "t:a/ops"}));
    r.erase("t:a", "mine");
    EXPECT_EQ(r.lookup("t:a", "mine")->instructions, "shared");
    EXPECT_FALSE(r.has_declared("t:a", "mine"));
}

TEST(AgentRegistry, ANodeOfAClusterFollowsDeclarationsAndDeletionsThroughTheStore) {
    store::MemoryStore st;
    StepClock clock;
    AgentRegistry r(st, clock, true);
    r.load({});
    // Declared through another node.
    store_agent(st, spec("other", "t:a"));
    EXPECT_EQ(r.lookup("t:a", "other"), nullptr);
    clock.now += 1000;
    r.sync(false);
    ASSERT_NE(r.lookup("t:a", "other"), nullptr);
    // Reads are spaced: within a second no read, unless forced (then 100 ms apart).
    const auto reads = st.counts().reads;
    clock.now += 50;
    r.sync(false);
    r.sync(true);
    EXPECT_EQ(st.counts().reads, reads);
    clock.now += 100;
    r.sync(true);
    EXPECT_EQ(st.counts().reads, reads + 1);
    // Deleted through another node: forgotten here at the next read.
    store::Batch b;
    b.erase_agents.emplace_back("t:a", "other");
    ASSERT_TRUE(st.commit_sync(std::move(b)).ok);
    clock.now += 1000;
    r.sync(false);
    EXPECT_EQ(r.lookup("t:a", "other"), nullptr);
    // Declared here (stored first, as the session manager does): kept by the next read.
    store_agent(st, spec("here", "t:a"));
    r.put_declared(spec("here", "t:a"));
    clock.now += 1000;
    r.sync(false);
    EXPECT_NE(r.lookup("t:a", "here"), nullptr);
}

TEST(AgentRegistry, AStoreThatCannotBeReadForgetsNothing) {
    store::MemoryStore st;
    StepClock clock;
    AgentRegistry r(st, clock, true);
    store_agent(st, spec("kept", "t:a"));
    EXPECT_EQ(r.load({}), 1u);
    st.set_down(true);
    bool ok = true;
    EXPECT_EQ(r.load({}, nullptr, &ok), 0u);
    EXPECT_FALSE(ok);
    clock.now += 1000;
    r.sync(false);
    EXPECT_NE(r.lookup("t:a", "kept"), nullptr);
}

TEST(AgentRegistry, ANodeAloneNeverReadsTheStoreAgain) {
    store::MemoryStore st;
    StepClock clock;
    AgentRegistry r(st, clock, false);
    r.load({});
    store_agent(st, spec("other", "t:a"));
    const auto reads = st.counts().reads;
    clock.now += 5000;
    r.sync(true);
    EXPECT_EQ(st.counts().reads, reads);
    EXPECT_EQ(r.lookup("t:a", "other"), nullptr);
}

TEST(AgentRegistry, AnAgentFromBeforeTenantsIsSharedAndStoredAgainAsSuch) {
    store::MemoryStore st;
    StepClock clock;
    AgentRegistry r(st, clock, false);
    store::Batch b;
    b.agents.push_back({"", "old", "id: \"old\"\ninstructions: \"from before\"\n", "", 1, 1});
    ASSERT_TRUE(st.commit_sync(std::move(b)).ok);
    EXPECT_EQ(r.load({}), 1u);
    const auto a = r.lookup("t:anyone", "old");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->tenant, agent::kSharedTenant);
    const auto rows = st.agents();
    ASSERT_TRUE(rows && rows->size() == 1);
    EXPECT_EQ(rows->at(0).tenant, agent::kSharedTenant);
}

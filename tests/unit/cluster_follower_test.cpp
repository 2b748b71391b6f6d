// The gateway's cluster follower over an in-memory etcd: it follows only what a gateway routes
// on, decodes off the routing lock, and replaces its view after a fresh list.

#include "gateway/cluster_follower.h"
#include "cluster/membership.h"

#include <gtest/gtest.h>

using namespace armada;
using namespace armada::cluster;
using armada::gateway::ClusterFollower;
using Kind = ClusterKeys::Parsed::Kind;

namespace {

std::string load(const std::string & node, const std::string & url) {
    NodeLoad l;
    l.node = node;
    l.free_seqs = 4;
    l.url = url;
    return encode_load(l);
}

}  // namespace

TEST(ClusterFollower, WatchesOnlyWhatAGatewayRoutesOn) {
    MemoryKv kv;
    ManualClock clock;
    const ClusterKeys k("/armada");
    ClusterFollower f(kv, "/armada", clock);
    for (const auto & p : f.prefixes()) {
        const auto kind = k.parse(p + (p.back() == '/' ? "x" : "")).kind;
        EXPECT_NE(kind, Kind::CellElection) << p;
        EXPECT_NE(p, "/armada/") << "not the whole prefix";
    }
    auto r = f.poll(0);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_TRUE(r.rebuilt);
    // Keys a gateway does not route on never reach it, however busy they are.
    for (int i = 0; i < 50; ++i) {
        kv.put(k.cell_failovers("c1"), "{}", 0);
        kv.put(k.cell_election("c1") + "/abc", "brain", 0);
        kv.put(k.global_election() + "/x", "g", 0);
        kv.put(k.rollout() + "spec", "{}", 0);
        kv.put(k.restart_request("n1"), "{}", 0);
        kv.put("/armada/global/shares-not", "{}", 0);
    }
    r = f.poll(0);
    ASSERT_TRUE(r.ok);
    EXPECT_FALSE(r.rebuilt);
    EXPECT_TRUE(r.changes.empty()) << r.changes.size() << " changes, the first " << r.changes.front().raw;
    // What it routes on comes decoded.
    kv.put(k.node("c1", "n1"), load("n1", "http://n1"), 0);
    kv.put(k.node("c1", "n2"), load("n2", ""), 0);  // no URL: not routable
    kv.put(k.gateway("gw-1"), "http://gw", 0);
    Shares s;
    s.weight["c1"] = 1;
    kv.put(k.shares(), encode_shares(s), 0);
    r = f.poll(0);
    ASSERT_TRUE(r.ok);
    ASSERT_EQ(r.changes.size(), 4u);
    EXPECT_EQ(r.changes[0].key.kind, Kind::Node);
    ASSERT_TRUE(r.changes[0].node);
    EXPECT_EQ(r.changes[0].node->cell, "c1");
    EXPECT_EQ(r.changes[0].node->load.url, "http://n1");
    EXPECT_FALSE(r.changes[1].node);
    bool gateway = false, shares = false;
    for (const auto & c : r.changes) {
        gateway |= c.key.kind == Kind::Gateway && c.put;
        shares |= c.key.kind == Kind::Shares && c.shares && c.shares->weight.at("c1") == 1;
    }
    EXPECT_TRUE(gateway);
    EXPECT_TRUE(shares);
}

TEST(ClusterFollower, AfterAnOutageItsViewIsRebuiltFromAFreshList) {
    MemoryKv kv;
    ManualClock clock;
    const ClusterKeys k("/armada");
    kv.put(k.node("c1", "n1"), load("n1", "http://n1"), 0);
    ClusterFollower f(kv, "/armada", clock);
    ASSERT_TRUE(f.poll(0).ok);
    kv.set_down(true);
    auto r = f.poll(0);
    EXPECT_FALSE(r.ok);
    EXPECT_GT(r.retry_in_ms, 0) << "the caller pauses while the cells cannot be read";
    kv.set_down(false);
    kv.erase(k.node("c1", "n1"));
    kv.put(k.node("c2", "n9"), load("n9", "http://n9"), 0);
    clock.advance(10000);
    r = f.poll(0);
    ASSERT_TRUE(r.ok) << r.error;
    ASSERT_TRUE(r.rebuilt);
    EXPECT_EQ(r.view.nodes.size(), 1u);
    EXPECT_EQ(r.view.nodes.count("n9"), 1u);
}

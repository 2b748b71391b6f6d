#include "cluster/cluster_config.h"

#include <gtest/gtest.h>

#include <set>

using namespace armada::cluster;

TEST(ClusterConfig, ReadsEveryServerAndKeepsDefaults) {
    std::string err;
    auto c = parse_cluster_config(R"(
etcd: [10.0.0.1:2379, 10.0.0.2:2379]
nats: nats://10.0.0.4:4222
redis: 10.0.0.5:6379
postgres: [postgres://armada@10.0.0.6/a0, postgres://armada@10.0.0.7/a1]
)",
                                  err);
    ASSERT_TRUE(c) << err;
    EXPECT_EQ(c->etcd.size(), 2u);
    EXPECT_EQ(c->postgres.size(), 2u);
    EXPECT_EQ(c->nats, "nats://10.0.0.4:4222");
    EXPECT_EQ(c->lease_ttl_s, 5);
    EXPECT_EQ(node_key(*c, "c1", "n7"), "/armada/cells/c1/nodes/n7");
    EXPECT_EQ(brain_election(*c, "c1"), "/armada/cells/c1/brain");
}

TEST(ClusterConfig, NamesTheSettingThatIsWrongAndNeverEchoesAPassword) {
    std::string err;
    EXPECT_FALSE(parse_cluster_config("etcd: [a:1]\npostgres: [postgres://x/y]\nleases: 3\n", err));
    EXPECT_EQ(err, "unknown setting 'leases'");
    EXPECT_FALSE(parse_cluster_config("postgres: [postgres://x/y]\n", err));
    EXPECT_NE(err.find("etcd"), std::string::npos);
    EXPECT_FALSE(parse_cluster_config("etcd: [a:1]\npostgres: [postgres://x/y]\nlease_ttl_s: 1\n", err));
    EXPECT_NE(err.find("lease_ttl_s"), std::string::npos);
    EXPECT_FALSE(parse_cluster_config("etcd: [a:1]\npostgres: [mysql://root:hunter2@db/x]\n", err));
    EXPECT_EQ(err, "postgres[0]: not a postgres:// URL");
    EXPECT_FALSE(parse_cluster_config("etcd: [a:1\n", err));  // not YAML
    EXPECT_NE(err.find("cluster file"), std::string::npos);
    EXPECT_FALSE(
        parse_cluster_config("etcd: [a:1]\npostgres: [postgres://x/y]\ncells: [{name: c1, water: 1.5}]\n", err));
    EXPECT_EQ(err, "cells[0]: water must be above 0 and at most 1");
    EXPECT_FALSE(parse_cluster_config("etcd: [a:1]\npostgres: [postgres://x/y]\ncells: [c1, c1]\n", err));
    EXPECT_EQ(err, "cells[1]: 'c1' is listed twice");
    EXPECT_FALSE(parse_cluster_config("etcd: [a:1]\npostgres: [postgres://x/y]\ncells: [{name: c1, size: 3}]\n", err));
    EXPECT_EQ(err, "cells[0]: unknown setting 'size'");
    const auto cells = parse_cluster_config(
        "etcd: [a:1]\npostgres: [postgres://x/y]\ncells:\n  - {name: c1, domain: room1, water: 0.6}\n  - c2\n", err);
    ASSERT_TRUE(cells) << err;
    ASSERT_EQ(cells->cells.size(), 2u);
    EXPECT_EQ(cells->cells[0].domain, "room1");
    EXPECT_DOUBLE_EQ(cells->cells[0].water, 0.6);
    EXPECT_EQ(cells->cells[1].name, "c2");
    EXPECT_DOUBLE_EQ(cells->cells[1].water, 0.57);
    EXPECT_TRUE(valid_cell_or_node_name("cell-1.eu_west"));
    EXPECT_FALSE(valid_cell_or_node_name("a/b"));
    EXPECT_FALSE(valid_cell_or_node_name(".a"));
    EXPECT_FALSE(valid_cell_or_node_name("a."));
    EXPECT_FALSE(valid_cell_or_node_name("a..b"));
    EXPECT_FALSE(valid_cell_or_node_name(""));
}

TEST(ClusterConfig, RetryPausesAreSpreadOverHalfToOneAndAHalfTimes) {
    std::set<int> seen;
    for (int i = 0; i < 400; ++i) {
        const int ms = jittered_ms(1000);
        ASSERT_GE(ms, 500);
        ASSERT_LE(ms, 1500);
        seen.insert(ms / 100);
    }
    // Spread over the range, not one value for everyone: every 100 ms band from 500 to 1500 is hit.
    for (int band = 5; band < 15; ++band)
        EXPECT_TRUE(seen.count(band)) << band * 100;
}

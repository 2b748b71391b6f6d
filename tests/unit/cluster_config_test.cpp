#include "cluster/cluster_config.h"
#include "cli/rollout_command.h"
#include "common/backoff.h"

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
        const int ms = armada::common::jittered_ms(1000);
        ASSERT_GE(ms, 500);
        ASSERT_LE(ms, 1500);
        seen.insert(ms / 100);
    }
    // Spread over the range, not one value for everyone: every 100 ms band from 500 to 1500 is hit.
    for (int band = 5; band < 15; ++band)
        EXPECT_TRUE(seen.count(band)) << band * 100;
}

TEST(ClusterConfig, RolloutSectionGivesStartItsDefaults) {
    std::string err;
    auto c = armada::cluster::parse_cluster_config(R"(etcd: [127.0.0.1:2379]
postgres: [postgres://x]
rollout:
  wave_percent: 10
  max_per_cell: 2
  settle_s: 300
  watch_before_s: 30
  ready_timeout_s: 900
  restarts_per_s: 0.5
  gates: {min_sessions: 20, latency_ratio: 2, heartbeat_excess: 1.5}
)",
                                                   err);
    ASSERT_TRUE(c) << err;
    EXPECT_EQ(c->rollout.wave_percent, 10);
    EXPECT_EQ(c->rollout.max_per_cell, 2);
    EXPECT_EQ(c->rollout.settle_s, 300);
    EXPECT_EQ(c->rollout.watch_before_s, 30);
    EXPECT_EQ(c->rollout.ready_timeout_s, 900);
    EXPECT_EQ(c->rollout.restarts_per_s, 0.5);
    EXPECT_EQ(c->rollout.gates.min_sessions, 20);
    EXPECT_EQ(c->rollout.gates.latency_ratio, 2);
    EXPECT_EQ(c->rollout.gates.heartbeat_excess, 1.5);
    EXPECT_EQ(c->rollout.gates.min_steps, armada::cluster::RolloutGates{}.min_steps);  // not named: default

    // A flag given wins; one not given comes from the file; the rest are the defaults.
    armada::cli::RolloutOptions o;
    o.version = "v2";
    o.settle_s = 60;
    o.gate_min_sessions = 5;
    o.wave_percent = 50;  // not marked as given: the file's 10 stands
    o.given = {"--settle", "--gate-min-sessions"};
    const auto s = armada::cli::rollout_spec(o, c->rollout, 1234);
    EXPECT_EQ(s.id, "r-1234");
    EXPECT_EQ(s.version, "v2");
    EXPECT_EQ(s.settle_ms, 60000);
    EXPECT_EQ(s.gates.min_sessions, 5);
    EXPECT_EQ(s.wave_percent, 10);
    EXPECT_EQ(s.max_per_cell, 2);
    EXPECT_EQ(s.before_ms, 30000);
    EXPECT_EQ(s.ready_timeout_ms, 900000);
    EXPECT_EQ(s.restarts_per_s, 0.5);
    EXPECT_EQ(s.gates.latency_ratio, 2);
    EXPECT_EQ(s.gates.min_steps, armada::cluster::RolloutGates{}.min_steps);
    // Without the section, the flags' defaults (and the watch: the settle time, at most 60 s).
    const auto plain = armada::cli::rollout_spec(armada::cli::RolloutOptions{}, {}, 1);
    EXPECT_EQ(plain.wave_percent, 5);
    EXPECT_EQ(plain.settle_ms, 120000);
    EXPECT_EQ(plain.before_ms, 60000);
}

TEST(ClusterConfig, RolloutSectionErrorsNameTheSetting) {
    const std::string base = "etcd: [127.0.0.1:2379]\npostgres: [postgres://x]\n";
    auto error_of = [&](const std::string & rollout) {
        std::string err;
        EXPECT_FALSE(armada::cluster::parse_cluster_config(base + rollout, err)) << rollout;
        return err;
    };
    EXPECT_EQ(error_of("rollout: {wave_pct: 5}\n"), "rollout: unknown setting 'wave_pct'");
    EXPECT_EQ(error_of("rollout: {wave_percent: 0}\n"), "rollout: wave_percent: must be from 0.1 to 100");
    EXPECT_EQ(error_of("rollout: {max_per_cell: 1.5}\n"),
              "rollout: max_per_cell: must be a whole number from 1 to 1000");
    EXPECT_EQ(error_of("rollout: {settle_s: soon}\n"), "rollout: settle_s: must be a number");
    EXPECT_EQ(error_of("rollout: {gates: {latency: 2}}\n"), "rollout: gates: unknown setting 'latency'");
    EXPECT_EQ(error_of("rollout: {gates: {success_drop: 2}}\n"), "rollout: gates: success_drop: must be from 0 to 1");
    EXPECT_EQ(error_of("rollout: 5\n"),
              "rollout: must be a map of settings (wave_percent, max_per_cell, settle_s, ...)");
    std::string err;
    EXPECT_TRUE(armada::cluster::parse_cluster_config(base + "rollout:\n", err)) << err;  // empty: the defaults
}

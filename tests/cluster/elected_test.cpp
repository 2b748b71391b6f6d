// Leadership through etcd (cluster/runtime/elected.h) against the real etcd of the adapter
// tests: the scenarios of elected_cases.h (the unit tests run them on the in-memory store), and
// that the election is kept the way etcd's own election service reads it.
#include "cluster/runtime/elected.h"
#include "cluster/runtime/election.h"
#include "elected_cases.h"
#include "servers.h"

#include <gtest/gtest.h>

using namespace armada;

TEST(Elected, ALeaderWhoseLoopStallsGivesUpTheLeadWithinOneTtlAndTheStandbyLeads) {
    cluster::EtcdKvStore a(servers().etcd.client(3000)), b(servers().etcd.client(3000));
    elected_cases::stalled_leader_hands_over(a, b, "/armada/test-elected/stall", 2);
}

TEST(Elected, ALeaderWhoseLoopKeepsMovingKeepsTheLead) {
    cluster::EtcdKvStore a(servers().etcd.client(3000)), b(servers().etcd.client(3000));
    elected_cases::moving_leader_keeps_the_lead(a, b, "/armada/test-elected/steady", 2);
}

TEST(Elected, AStoppedLeaderHandsOverAtOnce) {
    cluster::EtcdKvStore a(servers().etcd.client(3000)), b(servers().etcd.client(3000));
    elected_cases::stopped_leader_hands_over_at_once(a, b, "/armada/test-elected/stop", 2);
}

TEST(Elected, EtcdsOwnElectionServiceSeesTheSameLeader) {
    // The election is kept as etcd's election service keeps one: its Leader call names ours.
    auto etcd = servers().etcd.client(3000);
    cluster::EtcdKvStore kv(etcd);
    int64_t lease = 0;
    ASSERT_EQ(kv.lease_grant(5000, lease), "");
    cluster::EtcdLeader me;
    const std::string election = "/armada/test-elected/compat";
    ASSERT_EQ(cluster::stand(kv, election, "brain x", lease, me), "");
    cluster::EtcdLeader seen;
    ASSERT_EQ(etcd.leader(election, seen), "");
    EXPECT_EQ(seen.key, me.key);
    EXPECT_EQ(seen.value, "brain x");
    EXPECT_EQ(seen.rev, me.rev);
    EXPECT_EQ(kv.lease_revoke(lease), "");
}

// Leadership over the key-value seam (cluster/runtime/election.h, elected.h) on the in-memory
// store: which candidate leads, the view that follows an election, the keep-alive's decisions on
// a scripted clock, and `Elected` itself with real threads (the cluster tests run the same
// scenarios on etcd).

#include "cluster/runtime/election.h"
#include "cluster/elected_cases.h"
#include "cluster/runtime/clock.h"
#include "cluster/runtime/kv.h"
#include "unit/live_kv.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

using namespace armada;
using namespace armada::cluster;

TEST(Election, TheOldestCandidateLeadsAndItsCreationRevisionIsTheEpoch) {
    MemoryKv kv;
    const int64_t la = kv.grant(), lb = kv.grant();
    EtcdLeader a, b, now;
    EXPECT_EQ(election_leader(kv, "/e", now), "no leader");
    ASSERT_EQ(stand(kv, "/e", "brain a", la, a), "");
    ASSERT_EQ(stand(kv, "/e", "brain b", lb, b), "");
    EXPECT_EQ(a.key, election_key("/e", la));
    EXPECT_NE(a.key, b.key);
    EXPECT_LT(a.rev, b.rev);
    ASSERT_EQ(election_leader(kv, "/e", now), "");
    EXPECT_EQ(now.key, a.key);
    EXPECT_EQ(now.value, "brain a");
    EXPECT_EQ(now.rev, a.rev);
    // Standing again keeps the candidate's place.
    EtcdLeader again;
    ASSERT_EQ(stand(kv, "/e", "brain a", la, again), "");
    EXPECT_EQ(again.rev, a.rev);
    ASSERT_EQ(election_leader(kv, "/e", now), "");
    EXPECT_EQ(now.key, a.key);
    // The leader resigns: the next oldest leads, under a higher epoch.
    ASSERT_EQ(resign(kv, a), "");
    ASSERT_EQ(election_leader(kv, "/e", now), "");
    EXPECT_EQ(now.key, b.key);
    EXPECT_GT(now.rev, a.rev);
    // Its lease ends: nobody leads.
    kv.revoke(lb);
    EXPECT_EQ(election_leader(kv, "/e", now), "no leader");
    // Keys of another election, or under a longer name, do not count.
    const int64_t lc = kv.grant();
    EtcdLeader c;
    ASSERT_EQ(stand(kv, "/e2", "brain c", lc, c), "");
    EXPECT_EQ(election_leader(kv, "/e", now), "no leader");
}

TEST(Election, ACandidacyUnderAnEndedLeaseOrNoLeaseIsRefused) {
    MemoryKv kv;
    const int64_t l = kv.grant();
    kv.revoke(l);
    EtcdLeader me;
    EXPECT_NE(stand(kv, "/e", "brain a", l, me), "");
    EXPECT_TRUE(me.key.empty());
    // Without a lease the key would outlive its process and hold the election for good.
    EXPECT_NE(stand(kv, "/e", "brain a", 0, me), "");
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    ASSERT_EQ(kv.list("/e/", kvs, rev), "");
    EXPECT_TRUE(kvs.empty());
}

TEST(Election, AResignDeletesOnlyTheCandidacyItMade) {
    MemoryKv kv;
    const int64_t la = kv.grant(), lb = kv.grant();
    EtcdLeader a, b, now;
    ASSERT_EQ(stand(kv, "/e", "a", la, a), "");
    ASSERT_EQ(stand(kv, "/e", "b", lb, b), "");
    // a's key made again under the same lease (a restore, then a stand): a newer candidacy.
    ASSERT_EQ(kv.erase(a.key), "");
    EtcdLeader again;
    ASSERT_EQ(stand(kv, "/e", "a", la, again), "");
    ASSERT_NE(again.rev, a.rev);
    ASSERT_EQ(resign(kv, a), "");
    std::optional<EtcdKv> kept;
    ASSERT_EQ(kv.get(a.key, kept), "");
    EXPECT_TRUE(kept) << "a resign of the old term deleted the newer candidacy";
    ASSERT_EQ(resign(kv, again), "");
    ASSERT_EQ(kv.get(a.key, kept), "");
    EXPECT_FALSE(kept);
    ASSERT_EQ(election_leader(kv, "/e", now), "");
    EXPECT_EQ(now.key, b.key);
}

TEST(Election, AViewFollowsTheElectionAndIsUnknownWhileTheStoreIsDown) {
    MemoryKv kv;
    ElectionView view(kv, "/e");
    std::string e;
    ASSERT_TRUE(view.refresh(0, e)) << e;
    EXPECT_FALSE(view.leader());
    const int64_t la = kv.grant(), lb = kv.grant();
    EtcdLeader a, b;
    ASSERT_EQ(stand(kv, "/e", "a", la, a), "");
    ASSERT_EQ(stand(kv, "/e", "b", lb, b), "");
    ASSERT_TRUE(view.refresh(50, e)) << e;
    ASSERT_TRUE(view.leader());
    EXPECT_EQ(view.leader()->key, a.key);
    kv.revoke(la);
    ASSERT_TRUE(view.refresh(50, e)) << e;
    ASSERT_TRUE(view.leader());
    EXPECT_EQ(view.leader()->key, b.key);
    kv.set_down(true);
    EXPECT_FALSE(view.refresh(50, e));
    EXPECT_FALSE(view.leader()) << "a view that cannot read the store must not name a leader";
    EXPECT_FALSE(view.refresh(50, e));
    kv.set_down(false);
    ASSERT_TRUE(view.refresh(50, e)) << e;  // listed again
    ASSERT_TRUE(view.leader());
    EXPECT_EQ(view.leader()->key, b.key);
}

TEST(LeaseStep, RenewsEveryThirdOfTheTtlAndGivesUpAfterTheStallLimit) {
    constexpr int64_t ttl = 3000;
    EXPECT_EQ(renew_every_ms(ttl), 1000);
    EXPECT_EQ(stall_limit_of(ttl), 2000);
    // Renewed at 0, beaten at 0.
    EXPECT_EQ(lease_step(999, 0, 0, true, ttl), LeaseStep::Wait);
    EXPECT_EQ(lease_step(1000, 0, 0, true, ttl), LeaseStep::Renew);
    EXPECT_EQ(lease_step(1999, 1000, 0, true, ttl), LeaseStep::Wait);
    EXPECT_EQ(lease_step(2001, 1000, 0, true, ttl), LeaseStep::GiveUp);
    // A standby has no loop to watch: it only renews.
    EXPECT_EQ(lease_step(60000, 59000, 0, false, ttl), LeaseStep::Renew);
    EXPECT_EQ(lease_step(60000, 59500, 0, false, ttl), LeaseStep::Wait);
    // No renewal for a whole TTL: the lease may be gone, leading or not (checked before a stall).
    EXPECT_EQ(lease_step(3000, 0, 2999, true, ttl), LeaseStep::Lost);
    EXPECT_EQ(lease_step(3000, 0, 0, false, ttl), LeaseStep::Lost);
    EXPECT_EQ(lease_step(2999, 0, 2999, true, ttl), LeaseStep::Renew);
    // A short TTL still renews at most every 300 ms.
    EXPECT_EQ(renew_every_ms(600), 300);
    EXPECT_EQ(lease_step(299, 0, 299, true, 600), LeaseStep::Wait);
    EXPECT_EQ(lease_step(300, 0, 300, true, 600), LeaseStep::Renew);
    EXPECT_EQ(stall_limit_ms(2), 1334);
}

TEST(ElectedOnMemoryKv, ALeaderWhoseLoopStallsGivesUpTheLeadWithinOneTtlAndTheStandbyLeads) {
    LiveKv live;
    elected_cases::stalled_leader_hands_over(live.kv, live.kv, "/e/stall", 2);
}

TEST(ElectedOnMemoryKv, ALeaderWhoseLoopKeepsMovingKeepsTheLead) {
    LiveKv live;
    elected_cases::moving_leader_keeps_the_lead(live.kv, live.kv, "/e/steady", 2);
}

TEST(ElectedOnMemoryKv, AStoppedLeaderHandsOverAtOnce) {
    LiveKv live;
    elected_cases::stopped_leader_hands_over_at_once(live.kv, live.kv, "/e/stop", 2);
}

TEST(ElectedOnMemoryKv, ALeaderWhoseKeyVanishesStopsLeadingAndStandsAgain) {
    // An etcd restored from a snapshot taken before this leader stood: its key and lease are
    // gone. It must see that it no longer leads, take a new lease and lead again.
    LiveKv live;
    const auto before = live.kv.snapshot();
    std::atomic<bool> stop{false};
    Elected a(live.kv, 2, "brain a", elected_cases::stopped_by(stop));
    std::atomic<int> terms{0};
    std::atomic<int64_t> first_lease{0}, second_lease{0};
    std::thread t([&] {
        a.run("/e/restore", "a", [&](const EtcdLeader & me) {
            (++terms == 1 ? first_lease : second_lease) = me.lease;
            elected_cases::healthy(a, me, "/e/restore");
        });
    });
    if (!elected_cases::first_leads([&] { return terms.load() == 1; }, stop, t)) return;
    live.kv.restore(before);
    const bool again = elected_cases::eventually([&] { return terms.load() == 2; }, 8000);
    stop = true;
    t.join();
    ASSERT_TRUE(again) << "the leader never noticed its key had gone";
    EXPECT_NE(first_lease.load(), second_lease.load());
}

namespace {

//! The store as a process cut off from etcd's lease renewals but not from its watches (a slow or
//! partitioned keep-alive): every renewal fails while `drop` is set; all else goes through.
class NoRenewals final : public ForwardingKv {
  public:
    using ForwardingKv::ForwardingKv;
    std::atomic<bool> drop{false};
    std::string lease_keepalive(int64_t l, bool & alive) override {
        return drop.load() ? "the renewal timed out" : in_.lease_keepalive(l, alive);
    }
};

}  // namespace

TEST(ElectedOnMemoryKv, ALeaderWhoseRenewalsFailStopsLeadingWithinOneTtl) {
    // Its watch still shows its own key as the oldest (this store never ends a lease by itself),
    // so only the renewals that did not get through can tell it that etcd may have ended its lease.
    MemoryKv kv;  // no clock: leases end only when revoked
    NoRenewals cut(kv);
    std::atomic<bool> stop{false};
    Elected a(cut, 2, "brain a", elected_cases::stopped_by(stop));
    std::atomic<int> terms{0};
    std::atomic<int64_t> ended_at{0};
    std::thread t([&] {
        a.run("/e/cut", "a", [&](const EtcdLeader & me) {
            ++terms;
            elected_cases::healthy(a, me, "/e/cut");
            if (ended_at.load() == 0) ended_at = elected_cases::now_ms();
        });
    });
    if (!elected_cases::first_leads([&] { return terms.load() == 1; }, stop, t)) return;
    const int64_t cut_at = elected_cases::now_ms();
    cut.drop = true;
    const bool ended = elected_cases::eventually([&] { return ended_at.load() > 0; }, 6000);
    stop = true;
    t.join();
    ASSERT_TRUE(ended) << "a leader whose lease could not be renewed went on leading";
    // Its last renewal was before the cut: it stops within a TTL of the cut (and a check).
    EXPECT_LE(ended_at.load() - cut_at, 2000 + 500) << "it led past the time etcd may have ended its lease";
}

// The etcd client against a real etcd (the Debian binary), started once for this executable.
#include "cluster/etcd.h"
#include "cluster/local_servers.h"
#include "servers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

using namespace armada::cluster;
namespace fs = std::filesystem;

namespace {

EtcdClient client() {
    return EtcdClient({servers().etcd.endpoint()}, 3000);
}

}  // namespace

TEST(EtcdCodec, Base64RoundTripsAndRefusesJunk) {
    for (const std::string & s : std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
        EXPECT_EQ(EtcdClient::unbase64(EtcdClient::base64(s)), s);
    }
    EXPECT_EQ(EtcdClient::base64("/armada/nodes/"), "L2FybWFkYS9ub2Rlcy8=");
    EXPECT_FALSE(EtcdClient::unbase64("ab$d"));
    EXPECT_FALSE(EtcdClient::unbase64("ab=c"));
    EXPECT_EQ(EtcdClient::prefix_end("/a/"), "/a0");
    EXPECT_EQ(EtcdClient::prefix_end(std::string("a\xff", 2)), "b");
}

TEST(Etcd, AKeyUnderALeaseGoesWhenTheLeaseIsNotKeptAliveAndTheWatchSaysSo) {
    auto c = client();
    int64_t lease = 0;
    ASSERT_EQ(c.grant(2, lease), "");
    ASSERT_EQ(c.put("/t1/nodes/n1", "{\"free\":3}", lease), "");
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    ASSERT_EQ(c.list("/t1/nodes/", kvs, rev), "");
    ASSERT_EQ(kvs.size(), 1u);
    EXPECT_EQ(kvs[0].value, "{\"free\":3}");
    EXPECT_EQ(kvs[0].lease, lease);

    std::mutex mu;
    std::vector<EtcdEvent> seen;
    std::atomic<bool> stop{false};
    std::string werr;
    std::thread w([&] {
        auto wc = client();
        werr = wc.watch(
            "/t1/nodes/", rev + 1,
            [&](const std::vector<EtcdEvent> & evs, int64_t) {
                std::lock_guard lk(mu);
                seen.insert(seen.end(), evs.begin(), evs.end());
                return true;
            },
            stop);
    });
    // Nobody keeps the lease alive: within its TTL (and etcd's lease check), the key goes.
    bool deleted = false;
    for (int i = 0; i < 100 && !deleted; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::lock_guard lk(mu);
        for (const auto & e : seen)
            deleted |= e.type == EtcdEvent::Type::Delete && e.kv.key == "/t1/nodes/n1";
    }
    stop = true;
    w.join();
    EXPECT_TRUE(deleted);
    EXPECT_EQ(werr, "");
    std::optional<EtcdKv> kv;
    ASSERT_EQ(c.get("/t1/nodes/n1", kv), "");
    EXPECT_FALSE(kv);
}

TEST(Etcd, KeepaliveHoldsALeaseAndARevokedOneIsReportedGone) {
    auto c = client();
    int64_t lease = 0;
    ASSERT_EQ(c.grant(2, lease), "");
    ASSERT_EQ(c.put("/t2/n", "x", lease), "");
    for (int i = 0; i < 8; ++i) {  // 4 s: twice the TTL
        int64_t ttl = 0;
        ASSERT_EQ(c.keepalive(lease, ttl), "");
        EXPECT_GT(ttl, 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    std::optional<EtcdKv> kv;
    ASSERT_EQ(c.get("/t2/n", kv), "");
    EXPECT_TRUE(kv);
    ASSERT_EQ(c.revoke(lease), "");
    int64_t ttl = 1;
    ASSERT_EQ(c.keepalive(lease, ttl), "");
    EXPECT_LE(ttl, 0);
    ASSERT_EQ(c.get("/t2/n", kv), "");
    EXPECT_FALSE(kv);
}

TEST(Etcd, OneCandidateLeadsAndTheNextLeadsWithAGreaterRevisionWhenItsLeaseGoes) {
    auto c = client();
    int64_t a = 0, b = 0;
    ASSERT_EQ(c.grant(10, a), "");
    ASSERT_EQ(c.grant(10, b), "");
    EtcdLeader la, lb;
    ASSERT_EQ(c.campaign("/t3/leader", "brain-a", a, 3000, la), "");
    EXPECT_GT(la.rev, 0);
    EXPECT_EQ(c.campaign("/t3/leader", "brain-b", b, 500, lb), "not elected yet");
    EtcdLeader now;
    ASSERT_EQ(c.leader("/t3/leader", now), "");
    EXPECT_EQ(now.value, "brain-a");
    EXPECT_EQ(now.rev, la.rev);
    ASSERT_EQ(c.revoke(a), "");  // the leader dies: its lease goes
    ASSERT_EQ(c.campaign("/t3/leader", "brain-b", b, 3000, lb), "");
    EXPECT_GT(lb.rev, la.rev);  // the epoch only grows
    ASSERT_EQ(c.leader("/t3/leader", now), "");
    EXPECT_EQ(now.value, "brain-b");
    ASSERT_EQ(c.resign(lb), "");
    EXPECT_EQ(c.leader("/t3/leader", now), "no leader");
}

TEST(Etcd, AnObserverSeesEachNewLeaderAsItComes) {
    auto c = client();
    std::mutex mu;
    std::vector<std::string> seen;
    std::atomic<bool> stop{false};
    std::string observe_error = "not returned";
    std::thread observer([&] {
        observe_error = client().observe(
            "/t5/leader",
            [&](const EtcdLeader & l) {
                std::lock_guard lk(mu);
                seen.push_back(l.value + "@" + std::to_string(l.rev));
                return true;
            },
            stop);
    });
    struct Joiner {
        std::atomic<bool> & stop;
        std::thread & t;
        ~Joiner() {
            stop = true;
            if (t.joinable()) t.join();
        }
    } joiner{stop, observer};  // an assertion that returns early still ends the stream
    auto saw = [&](size_t n) {
        for (int i = 0; i < 100; ++i) {
            {
                std::lock_guard lk(mu);
                if (seen.size() >= n) return true;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return false;
    };
    int64_t a = 0, b = 0;
    ASSERT_EQ(c.grant(10, a), "");
    ASSERT_EQ(c.grant(10, b), "");
    EtcdLeader la, lb;
    ASSERT_EQ(c.campaign("/t5/leader", "brain-a", a, 3000, la), "");
    ASSERT_TRUE(saw(1));
    ASSERT_EQ(c.revoke(a), "");
    ASSERT_EQ(c.campaign("/t5/leader", "brain-b", b, 3000, lb), "");
    ASSERT_TRUE(saw(2));
    stop = true;
    observer.join();
    EXPECT_EQ(observe_error, "");  // stopped, not broken
    std::lock_guard lk(mu);
    EXPECT_EQ(seen.at(0), "brain-a@" + std::to_string(la.rev));
    EXPECT_EQ(seen.at(1), "brain-b@" + std::to_string(lb.rev));
}

TEST(Etcd, KeysSurviveARestartOnTheSameDirectory) {
    auto c = client();
    ASSERT_EQ(c.put("/t4/cellmap", "v1"), "");
    ASSERT_EQ(servers().etcd.restart(), "");
    std::optional<EtcdKv> kv;
    ASSERT_EQ(c.get("/t4/cellmap", kv), "");
    ASSERT_TRUE(kv);
    EXPECT_EQ(kv->value, "v1");
}

TEST(Etcd, AnUnreachableEndpointIsNamedInTheError) {
    EtcdClient c({"127.0.0.1:" + std::to_string(free_port())}, 500);
    std::optional<EtcdKv> kv;
    const std::string e = c.get("/x", kv);
    EXPECT_NE(e.find("etcd at 127.0.0.1:"), std::string::npos) << e;
}

TEST(Etcd, ATxnPutsOnlyWhileItsComparesHold) {
    auto c = client();
    bool ok = false;
    int64_t rev = 0;
    // A missing key has revision 0: "create it only if nobody has".
    ASSERT_EQ(c.txn({{EtcdCompare::Target::Mod, "/t5/state", 0}}, {{"/t5/state", "a"}}, ok, rev), "");
    EXPECT_TRUE(ok);
    ASSERT_EQ(c.txn({{EtcdCompare::Target::Mod, "/t5/state", 0}}, {{"/t5/state", "b"}}, ok, rev), "");
    EXPECT_FALSE(ok);
    std::optional<EtcdKv> kv;
    ASSERT_EQ(c.get("/t5/state", kv), "");
    ASSERT_TRUE(kv);
    EXPECT_EQ(kv->value, "a");
    EXPECT_EQ(kv->mod_revision, rev);  // the failed txn changed nothing
    // Its mod revision as read: the write goes in, and the same revision again is stale.
    ASSERT_EQ(c.txn({{EtcdCompare::Target::Mod, "/t5/state", kv->mod_revision}}, {{"/t5/state", "c"}}, ok, rev), "");
    EXPECT_TRUE(ok);
    ASSERT_EQ(c.txn({{EtcdCompare::Target::Mod, "/t5/state", kv->mod_revision}}, {{"/t5/state", "d"}}, ok, rev), "");
    EXPECT_FALSE(ok);
    // A leader's fence: its election key's creation revision. Once it resigns, its writes fail.
    int64_t lease = 0;
    ASSERT_EQ(c.grant(10, lease), "");
    EtcdLeader me;
    ASSERT_EQ(c.campaign("/t5/election", "me", lease, 3000, me), "");
    ASSERT_GT(me.rev, 0);
    ASSERT_EQ(c.get("/t5/state", kv), "");
    const std::vector<EtcdCompare> fence{{EtcdCompare::Target::Mod, "/t5/state", kv->mod_revision},
                                         {EtcdCompare::Target::Create, me.key, me.rev}};
    ASSERT_EQ(c.txn(fence, {{"/t5/state", "e"}, {"/t5/other", "f"}}, ok, rev), "");
    EXPECT_TRUE(ok);
    ASSERT_EQ(c.get("/t5/other", kv), "");
    ASSERT_TRUE(kv);
    EXPECT_EQ(kv->value, "f");
    ASSERT_EQ(c.resign(me), "");
    ASSERT_EQ(c.get("/t5/state", kv), "");
    ASSERT_EQ(c.txn({{EtcdCompare::Target::Mod, "/t5/state", kv->mod_revision},
                     {EtcdCompare::Target::Create, me.key, me.rev}},
                    {{"/t5/state", "g"}}, ok, rev),
              "");
    EXPECT_FALSE(ok);
    ASSERT_EQ(c.get("/t5/state", kv), "");
    EXPECT_EQ(kv->value, "e");
    c.revoke(lease);
}

TEST(Etcd, ItsHistoryIsCompactedOnItsOwnAndItsStatusShowsSizeAndAlarms) {
    // A short retention so the test sees a compaction; `cluster up` keeps a minute.
    LocalEtcd etcd;
    etcd.set_compaction("2s", int64_t(1) << 30);
    ASSERT_EQ(etcd.start(servers().root + "/etcd-compaction"), "");
    EtcdClient c({etcd.endpoint()}, 3000);
    std::vector<EtcdKv> none;
    int64_t first = 0;
    ASSERT_EQ(c.list("/load/", none, first), "");
    for (int i = 0; i < 50; ++i)
        ASSERT_EQ(c.put("/load/node", std::to_string(i)), "");
    // A watch from before those puts is refused once etcd has compacted them away.
    std::string why;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::atomic<bool> stop{false};
    while (std::chrono::steady_clock::now() < until) {
        why = c.watch(
            "/load/", first + 1, [](const std::vector<EtcdEvent> &, int64_t) { return false; }, stop);
        if (why.find("compacted") != std::string::npos) break;
        ASSERT_EQ(c.put("/load/node", "again"), "");  // each pass of periodic compaction needs new writes
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    EXPECT_NE(why.find("compacted"), std::string::npos) << "history was never compacted: " << why;
    EtcdStatus st;
    bool alarms_known = false;
    ASSERT_EQ(c.status(st, alarms_known), "");
    EXPECT_GT(st.db_bytes, 0);
    EXPECT_GT(st.db_in_use_bytes, 0);
    EXPECT_GE(st.revision, first + 50);
    EXPECT_FALSE(st.version.empty());
    EXPECT_TRUE(alarms_known) << "no auth here: the alarm list is readable";
    EXPECT_TRUE(st.alarms.empty());
    EXPECT_EQ(etcd.stop(), "");
}

// A node's membership of its cell, against a real etcd.
#include "cluster/membership.h"
#include "hang_proxy.h"
#include "servers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

using namespace armada::cluster;

namespace {

EtcdClient client() {
    return EtcdClient({servers().etcd.endpoint()}, 3000);
}

//! Waits up to `ms` for `pred`.
template <typename F>
bool eventually(F pred, int ms = 10000) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pred();
}

std::optional<NodeLoad> reported(const std::string & key) {
    std::optional<EtcdKv> kv;
    if (!client().get(key, kv).empty() || !kv) return std::nullopt;
    return decode_load("n", kv->value);
}

}  // namespace

TEST(NodeLoadCodec, RoundTripsAndRefusesJunk) {
    NodeLoad l;
    l.node = "n1";
    l.free_seqs = 17;
    l.kv_headroom = 5ll << 30;
    l.sessions = 40;
    l.version = "0.5.0";
    l.fingerprint = "model=abc";
    l.draining = true;
    l.kv_by_tenant = {{"t:acme", 123456789012}, {"0123abcd", 5}};
    l.cores = 48;
    l.step_ms = 212.5;
    l.signals = {1700000000000, 40, 12.5, 7, 2, {{"model", 3}, {"http_5xx", 1}}, 1, 2, 0};
    auto back = decode_load("n1", encode_load(l));
    ASSERT_TRUE(back);
    EXPECT_EQ(back->free_seqs, 17);
    EXPECT_EQ(back->kv_headroom, 5ll << 30);
    EXPECT_EQ(back->sessions, 40);
    EXPECT_EQ(back->fingerprint, "model=abc");
    EXPECT_TRUE(back->draining);
    EXPECT_EQ(back->kv_by_tenant, l.kv_by_tenant);
    EXPECT_EQ(back->cores, 48);
    EXPECT_DOUBLE_EQ(back->step_ms, 212.5);
    EXPECT_EQ(back->signals, l.signals);
    // A report without signals (an older node) reads as none; signals of the wrong shape too.
    EXPECT_EQ(decode_load("n1", R"({"free_seqs":1})")->signals, NodeSignals{});
    EXPECT_EQ(decode_load("n1", R"({"signals":{"steps":"x"}})")->signals, NodeSignals{});
    EXPECT_FALSE(decode_load("n1", "not json"));
    EXPECT_FALSE(decode_load("n1", "{\"kv_by_tenant\":{\"t:a\":\"lots\"}}"));
    EXPECT_FALSE(decode_load("n1", "{\"free_seqs\":\"many\"}"));
}

TEST(NodeMembership, ANodeJoinsReportsItsLoadAndLeavesAtOnceWhenItStops) {
    std::atomic<int> free{8};
    const std::string key = "/m1/cells/c1/nodes/n1";
    {
        NodeMembership m(client(), key, 3, 200, [&] {
            NodeLoad l;
            l.free_seqs = free.load();
            return l;
        });
        m.start();
        ASSERT_TRUE(eventually([&] { return reported(key) && reported(key)->free_seqs == 8; }));
        EXPECT_NE(m.lease(), 0);
        free = 3;
        EXPECT_TRUE(eventually([&] { return reported(key) && reported(key)->free_seqs == 3; }));
        m.stop();
        // Revoked on the way out: gone now, not a lease TTL later.
        EXPECT_FALSE(reported(key));
    }
}

TEST(NodeMembership, ANodeWhoseLeaseWentJoinsAgain) {
    const std::string key = "/m2/cells/c1/nodes/n1";
    NodeMembership m(client(), key, 3, 200, [] { return NodeLoad{}; });
    m.start();
    ASSERT_TRUE(eventually([&] { return m.registrations() == 1 && reported(key).has_value(); }));
    // As if the node had been stopped past its TTL: the lease is gone, and with it the key.
    const int64_t old = m.lease();
    ASSERT_EQ(client().revoke(old), "");
    EXPECT_FALSE(reported(key));
    ASSERT_TRUE(eventually([&] { return m.registrations() == 2 && reported(key).has_value(); }));
    EXPECT_NE(m.lease(), old);
    m.stop();
}

TEST(NodeMembership, RenewalsThatFailWhileEtcdIsAwayAreCountedInItsReports) {
    const std::string key = "/m9/cells/c1/nodes/n1";
    NodeMembership m(client(), key, 10, 200, [] { return NodeLoad{}; });
    m.start();
    ASSERT_TRUE(eventually([&] { return reported(key).has_value(); }));
    EXPECT_EQ(reported(key)->signals.renew_failed, 0);
    EXPECT_EQ(reported(key)->signals.lease_lost, 0);
    ASSERT_EQ(servers().etcd.restart(), "");
    ASSERT_TRUE(eventually([&] {
        auto l = reported(key);
        return l && l->signals.renew_failed + l->signals.renew_late >= 1;
    }));
    m.stop();
}

TEST(NodeMembership, KvIsFetchedOnlyFromAMemberWithALiveLease) {
    auto etcd = client();
    std::string why;
    NodeLoad l;
    l.url = "http://127.0.0.1:1";
    // A key written by hand, with no lease: not a member, whatever it says.
    const std::string fake = "/m4/cells/c1/nodes/intruder";
    ASSERT_EQ(etcd.put(fake, encode_load(l)), "");
    EXPECT_EQ(member_url(etcd, fake, "intruder", why), "");
    EXPECT_NE(why.find("no lease"), std::string::npos) << why;
    // No key at all.
    EXPECT_EQ(member_url(etcd, "/m4/cells/c1/nodes/nobody", "nobody", why), "");
    EXPECT_NE(why.find("not in its cell"), std::string::npos) << why;
    // A member that holds its lease.
    const std::string key = "/m4/cells/c1/nodes/n1";
    NodeMembership m(client(), key, 3, 200, [&] { return l; });
    m.start();
    ASSERT_TRUE(eventually([&] { return reported(key).has_value(); }));
    EXPECT_EQ(member_url(etcd, key, "n1", why), "http://127.0.0.1:1") << why;
    m.stop();
    EXPECT_EQ(member_url(etcd, key, "n1", why), "");
}

TEST(NodeMembership, ALeaseIsRenewedThroughTheNextEndpointWhileTheFirstHangs) {
    // etcd reached through a proxy first, and directly second. Once the proxy hangs, every
    // renewal waits on it before the next endpoint answers: a wait longer than what is left of
    // the TTL would lose the lease of a node that is well.
    HangProxy proxy(std::stoi(servers().etcd.endpoint().substr(servers().etcd.endpoint().rfind(':') + 1)));
    ASSERT_NE(proxy.port(), 0);
    const std::string key = "/m10/cells/c1/nodes/n1";
    NodeMembership m(EtcdClient({"127.0.0.1:" + std::to_string(proxy.port()), servers().etcd.endpoint()}, 5000), key, 3,
                     1000, [] { return NodeLoad{}; });
    m.start();
    ASSERT_TRUE(eventually([&] { return m.registrations() == 1 && reported(key).has_value(); }));
    const int64_t lease = m.lease();
    proxy.hang();
    // Three TTLs: each renewal gives up on the proxy within a third of the TTL (two thirds, shared
    // by the two endpoints).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(9);
    while (std::chrono::steady_clock::now() < until) {
        ASSERT_EQ(m.lease(), lease) << "the lease was lost while one endpoint hung";
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(m.registrations(), 1);
    EXPECT_TRUE(reported(key).has_value());
    proxy.resume();
    m.stop();
}

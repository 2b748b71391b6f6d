// NodeMembership over the key-value seam: its lease lives while its reports are slow, and a lease
// found gone is taken again.

#include "cluster/membership.h"
#include "unit/live_kv.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

using namespace armada;
using namespace armada::cluster;

namespace {

//! Load reports (puts) that take as long as asked: an etcd that has just restarted, or a token
//! being renewed, while the same client renews the lease.
class SlowPuts final : public ForwardingKv {
  public:
    using ForwardingKv::ForwardingKv;
    std::atomic<int> delay_ms{0};
    std::atomic<int> slow_puts{0};
    std::string put(const std::string & k, const std::string & v, int64_t l) override {
        if (const int d = delay_ms.load(); d > 0) {
            ++slow_puts;
            std::this_thread::sleep_for(std::chrono::milliseconds(d));
        }
        return in_.put(k, v, l);
    }
};

template <class F>
bool eventually(F f, int ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
        if (f()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return f();
}

bool holds_key(MemoryKv & kv, const std::string & key, int64_t lease) {
    std::optional<EtcdKv> got;
    return kv.get(key, got).empty() && got && got->lease == lease && lease != 0;
}

}  // namespace

TEST(NodeMembershipOnMemoryKv, ItsLeaseLivesThroughReportsSlowerThanTheTtl) {
    LiveKv live;
    auto slow = std::make_shared<SlowPuts>(live.kv);
    const std::string key = "/armada/cells/c0/nodes/n1";
    NodeMembership m(slow, key, 1, 200, [] { return NodeLoad{}; });  // a 1 s TTL, a report every 200 ms
    m.start();
    ASSERT_TRUE(eventually([&] { return m.lease() != 0; }, 2000));
    const int64_t lease = m.lease();
    // Every report now takes 1.5 TTLs. Two of them in a row cover three TTLs.
    slow->delay_ms = 1500;
    ASSERT_TRUE(eventually([&] { return slow->slow_puts.load() >= 3; }, 8000));
    EXPECT_EQ(m.registrations(), 1) << "the node lost its lease while a report was slow";
    EXPECT_EQ(m.lease(), lease);
    EXPECT_TRUE(holds_key(live.kv, key, lease)) << "its key went with its lease";
    EXPECT_TRUE(m.current());
    slow->delay_ms = 0;
    m.stop();
    std::optional<EtcdKv> got;
    ASSERT_EQ(live.kv.get(key, got), "");
    EXPECT_FALSE(got) << "a node that stops revokes its lease: its key goes at once";
}

TEST(NodeMembershipOnMemoryKv, ALeaseFoundGoneIsTakenAgainAndTheKeyComesBack) {
    LiveKv live;
    auto kv = std::make_shared<ForwardingKv>(live.kv);
    const std::string key = "/armada/cells/c0/nodes/n2";
    NodeMembership m(kv, key, 1, 200, [] { return NodeLoad{}; });
    m.start();
    ASSERT_TRUE(eventually([&] { return m.lease() != 0; }, 2000));
    const int64_t first = m.lease();
    live.kv.revoke(first);  // etcd ended it (a restore, or the node was away past its TTL)
    ASSERT_TRUE(eventually([&] { return m.registrations() == 2; }, 5000));
    EXPECT_NE(m.lease(), first);
    EXPECT_TRUE(eventually([&] { return holds_key(live.kv, key, m.lease()); }, 2000));
    m.stop();
}

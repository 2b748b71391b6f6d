// Leadership through etcd (cluster/runtime/elected.h) against the real etcd of the adapter
// tests: a leader whose loop stops moving gives the lead up within one lease TTL.
#include "cluster/runtime/elected.h"
#include "servers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

using namespace armada;

namespace {

int64_t now_ms() {
    return cluster::brain_now_ms();
}

//! Polls `cond` every 20 ms for up to `ms`; true as soon as it holds.
template <class F>
bool eventually(F cond, int ms) {
    const int64_t until = now_ms() + ms;
    while (now_ms() < until) {
        if (cond()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return cond();
}

}  // namespace

TEST(Elected, ALeaderWhoseLoopStallsGivesUpTheLeadWithinOneTtlAndTheStandbyLeads) {
    constexpr int kTtlS = 2;
    const std::string election = "/armada/test-elected/stall";
    std::atomic<bool> stop{false};
    const auto wait_stop = [&](int ms) {
        eventually([&] { return stop.load(); }, ms);
        return stop.load();
    };
    auto etcd_a = servers().etcd.client(3000);
    auto etcd_b = servers().etcd.client(3000);
    cluster::Elected a(etcd_a, kTtlS, "brain a", wait_stop);
    cluster::Elected b(etcd_b, kTtlS, "brain b", wait_stop);

    std::atomic<int> a_led{0};
    std::atomic<bool> b_leads{false}, a_still_after{true};
    std::atomic<int64_t> a_stalled_at{0}, b_led_at{0};
    // A healthy loop: beats, checks its lead about every 100 ms.
    const auto healthy = [&](cluster::Elected & e, const cluster::EtcdLeader & me) {
        while (!e.wait_signal(100)) {
            e.beat();
            if (!e.still_leader(me, election)) return;
        }
    };
    std::thread ta([&] {
        a.run(election, "a", [&](const cluster::EtcdLeader & me) {
            if (++a_led > 1) return healthy(a, me);
            // Leads for a while as a healthy loop would, then blocks (a call that hangs) until
            // the standby leads, or for four TTLs.
            for (int i = 0; i < 10 && !a.wait_signal(100); ++i)
                a.beat();
            a_stalled_at = now_ms();
            eventually([&] { return b_leads.load() || stop.load(); }, 4 * kTtlS * 1000);
            a_still_after = a.still_leader(me, election);
        });
    });
    ASSERT_TRUE(eventually([&] { return a_led.load() > 0; }, 15000)) << "a never led";
    std::thread tb([&] {
        b.run(election, "b", [&](const cluster::EtcdLeader & me) {
            b_led_at = now_ms();
            b_leads = true;
            healthy(b, me);
            b_leads = false;
        });
    });
    const bool b_led = eventually([&] { return b_leads.load(); }, 6 * kTtlS * 1000);
    stop = true;
    ta.join();
    tb.join();
    ASSERT_TRUE(b_led) << "the standby never led while the leader's loop was stuck";
    ASSERT_GT(a_stalled_at.load(), 0);
    // One TTL after the last beat at most, plus etcd's and the campaign's own latency.
    EXPECT_LE(b_led_at.load() - a_stalled_at.load(), kTtlS * 1000 + 1500);
    EXPECT_FALSE(a_still_after.load()) << "the stuck loop, once awake, must see it no longer leads";
    EXPECT_EQ(a.stalls(), 1);
    EXPECT_EQ(b.stalls(), 0);
}

TEST(Elected, ALeaderWhoseLoopKeepsMovingKeepsTheLead) {
    constexpr int kTtlS = 2;
    const std::string election = "/armada/test-elected/steady";
    std::atomic<bool> stop{false};
    const auto wait_stop = [&](int ms) {
        eventually([&] { return stop.load(); }, ms);
        return stop.load();
    };
    auto etcd_a = servers().etcd.client(3000);
    auto etcd_b = servers().etcd.client(3000);
    cluster::Elected a(etcd_a, kTtlS, "brain a", wait_stop);
    cluster::Elected b(etcd_b, kTtlS, "brain b", wait_stop);
    std::atomic<int> a_led{0}, b_led{0};
    std::atomic<int64_t> a_lost_at{0};
    std::thread ta([&] {
        a.run(election, "a", [&](const cluster::EtcdLeader & me) {
            ++a_led;
            while (!a.wait_signal(100)) {
                a.beat();
                if (!a.still_leader(me, election)) {
                    a_lost_at = now_ms();
                    return;
                }
            }
        });
    });
    ASSERT_TRUE(eventually([&] { return a_led.load() > 0; }, 15000));
    std::thread tb([&] { b.run(election, "b", [&](const cluster::EtcdLeader &) { ++b_led; }); });
    // Three TTLs with a moving loop: the lead stays where it is.
    const bool moved = eventually([&] { return b_led.load() > 0 || a_lost_at.load() > 0; }, 3 * kTtlS * 1000);
    stop = true;
    ta.join();
    tb.join();
    EXPECT_FALSE(moved);
    EXPECT_EQ(a.stalls(), 0);
}

#pragma once

// Leadership scenarios run against any key-value store: real etcd in the cluster tests, the
// in-memory store in the unit tests. Each brain gets a store of its own (or the same one).

#include "cluster/runtime/elected.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace armada::elected_cases {

inline int64_t now_ms() {
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

//! A brain's stop signal: set `stop` to stop it.
inline cluster::Elected::WaitStop stopped_by(std::atomic<bool> & stop) {
    return [&stop](int ms) {
        eventually([&] { return stop.load(); }, ms);
        return stop.load();
    };
}

//! Waits up to 15 s for `led`; if it never holds, stops and joins `t` (a test thread left running
//! would end the process) and records the failure. The caller returns on false.
template <class F>
bool first_leads(F led, std::atomic<bool> & stop, std::thread & t) {
    if (eventually(led, 15000)) return true;
    stop = true;
    t.join();
    ADD_FAILURE() << "a never led";
    return false;
}

//! How many candidates stand in `election` now (-1: the store cannot say).
inline int candidates(cluster::KvStore & kv, const std::string & election) {
    std::vector<cluster::EtcdKv> kvs;
    int64_t revision = 0;
    if (!kv.list(election + "/", kvs, revision).empty()) return -1;
    return int(kvs.size());
}

//! A healthy leader's loop: beats, checks its lead about every 100 ms.
inline void healthy(cluster::Elected & e, const cluster::EtcdLeader & me, const std::string & election) {
    while (!e.wait_signal(100)) {
        e.beat();
        if (!e.still_leader(me, election)) return;
    }
}

//! A leads, then its loop blocks (a call that hangs): it must give the lead up within one TTL of
//! its last beat, and B must lead.
inline void stalled_leader_hands_over(cluster::KvStore & kv_a, cluster::KvStore & kv_b, const std::string & election,
                                      int ttl_s) {
    std::atomic<bool> stop{false};
    cluster::Elected a(kv_a, ttl_s, "brain a", stopped_by(stop));
    cluster::Elected b(kv_b, ttl_s, "brain b", stopped_by(stop));

    std::atomic<int> a_led{0};
    std::atomic<bool> b_leads{false}, a_still_after{true};
    std::atomic<int64_t> a_stalled_at{0}, b_led_at{0};
    std::thread ta([&] {
        a.run(election, "a", [&](const cluster::EtcdLeader & me) {
            if (++a_led > 1) return healthy(a, me, election);
            // Leads for a while as a healthy loop would, then blocks until the standby leads, or
            // for four TTLs.
            for (int i = 0; i < 10 && !a.wait_signal(100); ++i)
                a.beat();
            a_stalled_at = now_ms();
            eventually([&] { return b_leads.load() || stop.load(); }, 4 * ttl_s * 1000);
            a_still_after = a.still_leader(me, election);
        });
    });
    if (!first_leads([&] { return a_led.load() > 0; }, stop, ta)) return;
    std::thread tb([&] {
        b.run(election, "b", [&](const cluster::EtcdLeader & me) {
            b_led_at = now_ms();
            b_leads = true;
            healthy(b, me, election);
            b_leads = false;
        });
    });
    const bool b_led = eventually([&] { return b_leads.load(); }, 6 * ttl_s * 1000);
    stop = true;
    ta.join();
    tb.join();
    ASSERT_TRUE(b_led) << "the standby never led while the leader's loop was stuck";
    ASSERT_GT(a_stalled_at.load(), 0);
    // One TTL after the last beat at most, plus the store's and the campaign's own latency.
    EXPECT_LE(b_led_at.load() - a_stalled_at.load(), ttl_s * 1000 + 1500);
    EXPECT_FALSE(a_still_after.load()) << "the stuck loop, once awake, must see it no longer leads";
    EXPECT_EQ(a.stalls(), 1);
    EXPECT_EQ(b.stalls(), 0);
}

//! A leader whose loop keeps moving keeps the lead for three TTLs while B stands.
inline void moving_leader_keeps_the_lead(cluster::KvStore & kv_a, cluster::KvStore & kv_b, const std::string & election,
                                         int ttl_s) {
    std::atomic<bool> stop{false};
    cluster::Elected a(kv_a, ttl_s, "brain a", stopped_by(stop));
    cluster::Elected b(kv_b, ttl_s, "brain b", stopped_by(stop));
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
    if (!first_leads([&] { return a_led.load() > 0; }, stop, ta)) return;
    std::thread tb([&] { b.run(election, "b", [&](const cluster::EtcdLeader &) { ++b_led; }); });
    // b stands behind a, so that the lead has somewhere to go.
    const bool b_stood = eventually([&] { return candidates(kv_b, election) == 2; }, 5000);
    const bool moved = eventually([&] { return b_led.load() > 0 || a_lost_at.load() > 0; }, 3 * ttl_s * 1000);
    stop = true;
    ta.join();
    tb.join();
    EXPECT_TRUE(b_stood) << "the standby never stood: nothing was tested";
    EXPECT_FALSE(moved);
    EXPECT_EQ(a.stalls(), 0);
}

//! A leader that stops (a stop signal) resigns and revokes its lease: the standby leads at once,
//! well inside one TTL.
inline void stopped_leader_hands_over_at_once(cluster::KvStore & kv_a, cluster::KvStore & kv_b,
                                              const std::string & election, int ttl_s) {
    std::atomic<bool> stop_a{false}, stop_b{false};
    cluster::Elected a(kv_a, ttl_s, "brain a", stopped_by(stop_a));
    cluster::Elected b(kv_b, ttl_s, "brain b", stopped_by(stop_b));
    std::atomic<bool> a_leads{false}, b_leads{false};
    std::atomic<int64_t> b_led_at{0};
    std::thread ta([&] {
        a.run(election, "a", [&](const cluster::EtcdLeader & me) {
            a_leads = true;
            healthy(a, me, election);
        });
    });
    if (!first_leads([&] { return a_leads.load(); }, stop_a, ta)) return;
    std::thread tb([&] {
        b.run(election, "b", [&](const cluster::EtcdLeader & me) {
            b_led_at = now_ms();
            b_leads = true;
            healthy(b, me, election);
        });
    });
    const bool b_stood = eventually([&] { return candidates(kv_b, election) == 2; }, 5000);  // b behind a
    EXPECT_TRUE(b_stood) << "the standby never stood: no handover to test";
    EXPECT_FALSE(b_leads.load());
    const int64_t stopped_at = now_ms();
    stop_a = true;
    ta.join();
    const bool b_led = eventually([&] { return b_leads.load(); }, 3 * ttl_s * 1000);
    stop_b = true;
    tb.join();
    ASSERT_TRUE(b_led);
    EXPECT_LT(b_led_at.load() - stopped_at, ttl_s * 1000 / 2) << "the standby waited for the lease to expire";
}

}  // namespace armada::elected_cases

// The engine's program scheduler and the KV hold across tool calls, on a scripted clock.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <chrono>

using namespace armada::engine;

namespace {

// Three programs with different histories, each with one waiting request, submitted in the order
// mid, light, heavy:
// - heavy arrived first (t=0) and has had 300 tokens of service;
// - mid arrived at t=100 and has had 100;
// - light is new (t=300), with none.
std::vector<SchedTicket> three(Scheduler & s) {
    s.arrive("heavy", 0);
    s.charge("heavy", 300, 50);
    s.arrive("mid", 100);
    s.charge("mid", 100, 150);
    s.arrive("mid", 200);
    s.arrive("light", 300);
    s.arrive("heavy", 300);
    return {{"mid", 200, 1}, {"light", 300, 2}, {"heavy", 300, 3}};
}

std::vector<std::string> names(const std::vector<SchedTicket> & t, const std::vector<size_t> & order) {
    std::vector<std::string> out;
    for (size_t i : order)
        out.push_back(t[i].program);
    return out;
}

}  // namespace

TEST(Scheduler, PoliciesParseAndName) {
    for (const char * n : {"plas", "program-fcfs", "fcfs"}) {
        auto p = parse_sched_policy(n);
        ASSERT_TRUE(p) << n;
        EXPECT_STREQ(sched_policy_name(*p), n);
    }
    EXPECT_FALSE(parse_sched_policy("PLAS"));
    EXPECT_FALSE(parse_sched_policy(""));
}

TEST(Scheduler, PlasServesTheProgramWithTheLeastServiceFirst) {
    Scheduler s(SchedPolicy::Plas, 10000);
    auto t = three(s);
    EXPECT_EQ(names(t, s.order(t, 400)), (std::vector<std::string>{"light", "mid", "heavy"}));
    // Service moves a program back: light gets 500 tokens while it runs.
    s.charge("light", 500, 450);
    EXPECT_EQ(names(t, s.order(t, 500)), (std::vector<std::string>{"mid", "heavy", "light"}));
}

TEST(Scheduler, ProgramFcfsServesTheProgramThatArrivedFirstFirst) {
    Scheduler s(SchedPolicy::ProgramFcfs, 10000);
    auto t = three(s);
    EXPECT_EQ(names(t, s.order(t, 400)), (std::vector<std::string>{"heavy", "mid", "light"}));
}

TEST(Scheduler, FcfsServesRequestsInArrivalOrder) {
    Scheduler s(SchedPolicy::Fcfs, 10000);
    auto t = three(s);
    EXPECT_EQ(names(t, s.order(t, 400)), (std::vector<std::string>{"mid", "light", "heavy"}));
}

TEST(Scheduler, AStarvedRequestGoesFirstOldestFirst) {
    Scheduler s(SchedPolicy::Plas, 1000);
    auto t = three(s);
    // heavy's request waited since 300: at 1299 it is still last, at 1300 it has waited the
    // limit. mid's (since 200) is starved from 1200, so both go ahead of light, the oldest first.
    t[2].submitted_ms = 300;
    t[0].submitted_ms = 200;
    t[1].submitted_ms = 1000;
    EXPECT_EQ(names(t, s.order(t, 1199)), (std::vector<std::string>{"light", "mid", "heavy"}));
    EXPECT_EQ(names(t, s.order(t, 1200)), (std::vector<std::string>{"mid", "light", "heavy"}));
    EXPECT_EQ(names(t, s.order(t, 1300)), (std::vector<std::string>{"mid", "heavy", "light"}));
    EXPECT_TRUE(s.starved(t[2], 1300));
    EXPECT_FALSE(s.starved(t[1], 1300));
}

TEST(Scheduler, ProgramKeysDoNotCrossTenants) {
    EXPECT_NE(Scheduler::program_key("a", "b/c"), Scheduler::program_key("a/b", "c"));
    EXPECT_NE(Scheduler::program_key("t1", "conv"), Scheduler::program_key("t2", "conv"));
    EXPECT_EQ(Scheduler::program_key("t1", "conv"), Scheduler::program_key("t1", "conv"));
}

TEST(Scheduler, IdleProgramsAreForgottenUnlessTheyHaveRequests) {
    Scheduler s(SchedPolicy::Plas, 1000, /*forget_ms=*/60000, /*max_programs=*/3);
    s.charge("old", 10, 0);
    s.charge("old-busy", 10, 0);
    s.charge("new", 10, 50000);
    s.expire(60000, [](const std::string & k) { return k == "old-busy"; });
    EXPECT_FALSE(s.find("old"));
    EXPECT_TRUE(s.find("old-busy"));
    EXPECT_TRUE(s.find("new"));
    // Past max_programs the least recently seen idle ones go.
    for (int i = 0; i < 4; ++i)
        s.charge("p" + std::to_string(i), 1, 60000 + i);
    s.expire(60010, [](const std::string & k) { return k == "old-busy"; });
    EXPECT_EQ(s.programs(), 3u);
    EXPECT_TRUE(s.find("old-busy"));
    EXPECT_TRUE(s.find("p3"));
    EXPECT_TRUE(s.find("p2"));
    EXPECT_EQ(s.service("new"), 0u);
}

TEST(KvHold, UnknownToolsGetTheDefault) {
    KvHold h(
        {.quantile = 0.9, .window = 8, .min_samples = 3, .margin_ms = 100, .max_hold_ms = 5000, .default_ms = 700});
    EXPECT_EQ(h.hold_ms("search"), 700);
    h.observe("search", 200);
    h.observe("search", 300);
    EXPECT_EQ(h.hold_ms("search"), 700);  // two samples are not enough
}

TEST(KvHold, TheHoldIsTheToolsP90PlusAMargin) {
    KvHold h(
        {.quantile = 0.9, .window = 16, .min_samples = 3, .margin_ms = 100, .max_hold_ms = 5000, .default_ms = 700});
    for (int ms : {100, 200, 300, 400, 500, 600, 700, 800, 900, 1000})
        h.observe("search", ms);
    EXPECT_EQ(h.hold_ms("search"), 900 + 100);
}

TEST(KvHold, AToolThatUsuallyTakesTooLongGetsNoHold) {
    KvHold h(
        {.quantile = 0.9, .window = 4, .min_samples = 3, .margin_ms = 100, .max_hold_ms = 5000, .default_ms = 700});
    for (int ms : {6000, 7000, 8000})
        h.observe("crawl", ms);
    EXPECT_EQ(h.hold_ms("crawl"), 0);
    // The window slides: once the tool is fast again, it is held again.
    for (int ms : {100, 120, 140, 160})
        h.observe("crawl", ms);
    EXPECT_EQ(h.hold_ms("crawl"), 260);
}

TEST(KvHold, AStepWaitingOnSeveralToolsHoldsForTheLongestOrNotAtAll) {
    KvHold h({.quantile = 0.9, .window = 8, .min_samples = 1, .margin_ms = 0, .max_hold_ms = 5000, .default_ms = 700});
    h.observe("fast", 100);
    h.observe("slow", 2000);
    h.observe("never", 60000);
    EXPECT_EQ(h.hold_ms(std::vector<std::string>{"fast", "slow"}), 2000);
    EXPECT_EQ(h.hold_ms(std::vector<std::string>{"fast", "never"}), 0);
    EXPECT_EQ(h.hold_ms(std::vector<std::string>{"fast", "unknown"}), 700);
}

TEST(KvHold, ItRemembersABoundedNumberOfTools) {
    KvHold h({.max_tools = 2,
              .quantile = 0.9,
              .window = 4,
              .min_samples = 1,
              .margin_ms = 0,
              .max_hold_ms = 5000,
              .default_ms = 700});
    h.observe("a", 100);
    h.observe("b", 200);
    h.observe("c", 300);
    int known = 0;
    for (const char * t : {"a", "b", "c"})
        known += h.hold_ms(t) != 700 ? 1 : 0;
    EXPECT_EQ(known, 2);
    EXPECT_EQ(h.hold_ms("c"), 300);
}

TEST(KvHold, AHeldSequenceParksWhenItsHoldEndsAnUnheldOneAfterTheGrace) {
    using ms = std::chrono::milliseconds;
    using T = std::chrono::steady_clock::time_point;
    const T t0{};
    const ms grace(1000);
    // Held for 5 s from t0: not at 1 s (the grace alone would park it), at 5 s.
    EXPECT_FALSE(park_due(true, t0 + ms(5000), t0, grace, t0 + ms(1000)));
    EXPECT_FALSE(park_due(true, t0 + ms(5000), t0, grace, t0 + ms(4999)));
    EXPECT_TRUE(park_due(true, t0 + ms(5000), t0, grace, t0 + ms(5000)));
    // A hold shorter than the grace parks earlier than the grace would.
    EXPECT_TRUE(park_due(true, t0 + ms(200), t0, grace, t0 + ms(200)));
    // Unheld: after the grace.
    EXPECT_FALSE(park_due(false, T{}, t0, grace, t0 + ms(999)));
    EXPECT_TRUE(park_due(false, T{}, t0, grace, t0 + ms(1000)));
}

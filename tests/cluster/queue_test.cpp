// The JetStream adapter against a real nats-server -js (the Debian binary).
#include "cluster/queue.h"
#include "cluster/local_servers.h"
#include "servers.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

using namespace armada::cluster;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<JetStream> connect() {
    std::string err;
    auto js = JetStream::connect(servers().nats.url(), err, servers().nats.credentials());
    EXPECT_TRUE(js) << err;
    return js;
}

//! Fetches until one message comes or `ms` pass.
std::vector<QueueMsg> fetch_one(Consumer & c, int ms = 5000) {
    std::string err;
    auto got = c.fetch(1, ms, err);
    EXPECT_EQ(err, "");
    return got;
}

}  // namespace

TEST(Queue, StreamsAreCreatedOnceWhoeverConnectsFirst) {
    auto a = connect();
    auto b = connect();  // the streams exist already: fine
    ASSERT_TRUE(a && b);
    std::string err;
    EXPECT_GE(a->stream_messages("ARMADA_PLACE", err), 0) << err;
    EXPECT_GE(a->stream_messages("ARMADA_DEAD", err), 0) << err;
}

TEST(Queue, APlaceRequestGoesToOneBrainAndLeavesTheQueueWhenAcked) {
    auto js = connect();
    ASSERT_TRUE(js);
    std::string err;
    auto brain_a = js->consumer("ARMADA_PLACE", "brain-c1", place_subject("c1"), 2000, 5, err);
    ASSERT_TRUE(brain_a) << err;
    auto brain_b = js->consumer("ARMADA_PLACE", "brain-c1", place_subject("c1"), 2000, 5, err);
    ASSERT_TRUE(brain_b) << err;
    ASSERT_EQ(js->publish(place_subject("c1"), "{\"session\":\"s1\"}"), "");
    auto got = fetch_one(*brain_a);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].data(), "{\"session\":\"s1\"}");
    EXPECT_EQ(got[0].deliveries(), 1u);
    EXPECT_TRUE(brain_b->fetch(1, 300, err).empty());  // one brain gets it, not both
    ASSERT_EQ(got[0].ack(), "");
    // A work queue: acked means gone (the ack is sent without waiting, so once the server has it).
    int64_t left = -1;
    for (int i = 0; i < 100 && (left = js->stream_messages("ARMADA_PLACE", err)) != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(left, 0);
}

TEST(Queue, AFetchReturnsWhenAMessageComesAndTakesWhatElseIsQueued) {
    auto js = connect();
    ASSERT_TRUE(js);
    std::string err;
    auto c = js->consumer("ARMADA_CMD", "node-f1", command_subject("f1"), 5000, 5, err);
    ASSERT_TRUE(c) << err;
    std::thread later([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        EXPECT_EQ(js->publish(command_subject("f1"), "one"), "");
    });
    // A batch of 16 and a long wait: one message is enough to return (well before the wait).
    const auto t0 = std::chrono::steady_clock::now();
    auto got = c->fetch(16, 30000, err);
    const auto waited = std::chrono::steady_clock::now() - t0;
    later.join();
    ASSERT_EQ(got.size(), 1u) << err;
    EXPECT_LT(waited, std::chrono::seconds(15));
    ASSERT_EQ(got[0].ack(), "");
    for (int i = 0; i < 5; ++i)
        ASSERT_EQ(js->publish(command_subject("f1"), "m" + std::to_string(i)), "");
    got = c->fetch(16, 30000, err);
    ASSERT_EQ(got.size(), 5u) << err;
    for (int i = 0; i < 5; ++i) {
        EXPECT_EQ(got[size_t(i)].data(), "m" + std::to_string(i));
        EXPECT_EQ(got[size_t(i)].ack(), "");
    }
}

TEST(Queue, NodeNamesWithDotsGetConsumersOfTheirOwn) {
    auto js = connect();
    ASSERT_TRUE(js);
    std::string err;
    auto dotted = js->consumer("ARMADA_CMD", "node-h1.example.com", command_subject("h1.example.com"), 5000, 5, err);
    ASSERT_TRUE(dotted) << err;
    auto plain = js->consumer("ARMADA_CMD", "node-h1", command_subject("h1"), 5000, 5, err);
    ASSERT_TRUE(plain) << err;
    ASSERT_EQ(js->publish(command_subject("h1.example.com"), "for the dotted one"), "");
    auto got = fetch_one(*dotted);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].data(), "for the dotted one");
    EXPECT_EQ(got[0].ack(), "");
    EXPECT_TRUE(plain->fetch(1, 300, err).empty());
}

TEST(Queue, AMessageNotAckedInTimeComesBack) {
    auto js = connect();
    ASSERT_TRUE(js);
    std::string err;
    auto c = js->consumer("ARMADA_CMD", "node-n1", command_subject("n1"), 500, 5, err);
    ASSERT_TRUE(c) << err;
    ASSERT_EQ(js->publish(command_subject("n1"), "run s1"), "");
    auto first = fetch_one(*c);
    ASSERT_EQ(first.size(), 1u);  // taken, then the taker dies (no ack)
    auto again = fetch_one(*c);
    ASSERT_EQ(again.size(), 1u);
    EXPECT_EQ(again[0].data(), "run s1");
    EXPECT_EQ(again[0].deliveries(), 2u);
    ASSERT_EQ(again[0].ack(), "");
}

TEST(Queue, AfterMaxDeliveriesAMessageGoesToTheDeadLetters) {
    auto js = connect();
    ASSERT_TRUE(js);
    std::string err;
    const int64_t dead_before = js->stream_messages("ARMADA_DEAD", err);
    auto c = js->consumer("ARMADA_CMD", "node-n2", command_subject("n2"), 300, 2, err);
    ASSERT_TRUE(c) << err;
    ASSERT_EQ(js->publish(command_subject("n2"), "poison"), "");
    for (int i = 0; i < 2; ++i) {
        auto m = fetch_one(*c);
        ASSERT_EQ(m.size(), 1u) << i;
        ASSERT_EQ(m[0].nak(), "");
    }
    EXPECT_TRUE(c->fetch(1, 1500, err).empty());  // the third delivery is moved aside
    EXPECT_EQ(js->stream_messages("ARMADA_DEAD", err), dead_before + 1);
}

TEST(Queue, APublishRepeatedWithItsIdIsStoredOnce) {
    auto js = connect();
    ASSERT_TRUE(js);
    std::string err;
    const int64_t before = js->stream_messages("ARMADA_EVENT", err);
    ASSERT_EQ(js->publish(event_subject("c9"), "ended s1", "ended:s1"), "");
    ASSERT_EQ(js->publish(event_subject("c9"), "ended s1", "ended:s1"), "");
    EXPECT_EQ(js->stream_messages("ARMADA_EVENT", err), before + 1);
}

TEST(Queue, QueuedPlaceRequestsSurviveAServerRestart) {
    auto js = connect();
    ASSERT_TRUE(js);
    for (int i = 0; i < 3; ++i)
        ASSERT_EQ(js->publish(place_subject("c2"), "s" + std::to_string(i)), "");
    ASSERT_EQ(servers().nats.restart(), "");
    // The client reconnects by itself; publishing may fail until it has.
    std::string err;
    std::unique_ptr<Consumer> c;
    for (int i = 0; i < 100 && !c; ++i) {
        c = js->consumer("ARMADA_PLACE", "brain-c2", place_subject("c2"), 2000, 5, err);
        if (!c) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(c) << err;
    std::vector<std::string> got;
    for (int i = 0; i < 3; ++i) {
        auto m = fetch_one(*c);
        ASSERT_EQ(m.size(), 1u) << i;
        got.push_back(m[0].data());
        ASSERT_EQ(m[0].ack(), "");
    }
    EXPECT_EQ(got, (std::vector<std::string>{"s0", "s1", "s2"}));
}

TEST(Queue, AReportOnCoreNatsReachesEverySubscriberAndIsNotKept) {
    auto brain = connect();
    auto global_a = connect();
    auto global_b = connect();
    ASSERT_TRUE(brain && global_a && global_b);
    std::string err;
    auto a = global_a->subscribe(report_subject("*"), err);
    ASSERT_TRUE(a) << err;
    auto b = global_b->subscribe(report_subject("*"), err);
    ASSERT_TRUE(b) << err;
    // A subscription is in place on the server once a round trip through it has been seen.
    std::vector<std::pair<std::string, std::string>> seen_a, seen_b;
    for (int i = 0; i < 50 && (seen_a.empty() || seen_b.empty()); ++i) {
        ASSERT_EQ(brain->publish_now(report_subject("probe"), "p"), "");
        for (auto [s, seen] : {std::pair{a.get(), &seen_a}, std::pair{b.get(), &seen_b}}) {
            auto more = s->take(8, 100);
            seen->insert(seen->end(), more.begin(), more.end());
        }
    }
    for (auto * seen : {&seen_a, &seen_b})
        ASSERT_FALSE(seen->empty());
    a->take(64, 50);
    b->take(64, 50);
    ASSERT_EQ(brain->publish_now(report_subject("r1"), "{\"n\":1}"), "");
    ASSERT_EQ(brain->publish_now(report_subject("r2"), "{\"n\":2}"), "");
    for (auto * s : {a.get(), b.get()}) {
        std::vector<std::pair<std::string, std::string>> got;
        for (int i = 0; i < 20 && got.size() < 2; ++i) {
            auto more = s->take(8, 250);
            got.insert(got.end(), more.begin(), more.end());
        }
        ASSERT_EQ(got.size(), 2u);  // both subscribers get both, in order, and nothing else
        EXPECT_EQ(got[0], std::make_pair(report_subject("r1"), std::string("{\"n\":1}")));
        EXPECT_EQ(got[1], std::make_pair(report_subject("r2"), std::string("{\"n\":2}")));
    }
    // No stream keeps them.
    for (const char * stream : {"ARMADA_PLACE", "ARMADA_CMD", "ARMADA_EVENT"}) {
        const int64_t before = brain->stream_messages(stream, err);
        ASSERT_EQ(brain->publish_now(report_subject("r3"), "x"), "");
        EXPECT_EQ(brain->stream_messages(stream, err), before) << stream;
    }
}

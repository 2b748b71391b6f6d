// A node's load report is written straight to text (encode_load): the bytes must be the ones a
// JSON document of the same fields dumps to, so that nothing reading etcd sees a change. It is
// read back in one pass when it is in that form (decode_load_canonical), and that reader must
// read exactly what the JSON parser reads, or leave the text to it.
#include "cluster/membership.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <random>

using namespace armada::cluster;
using json = nlohmann::json;

namespace {

//! The report as a document, dumped: what encode_load wrote before it wrote text directly.
std::string as_document(const NodeLoad & l) {
    return json{{"free_seqs", l.free_seqs},
                {"kv_headroom", l.kv_headroom},
                {"kv_budget", l.kv_budget},
                {"sessions", l.sessions},
                {"version", l.version},
                {"fingerprint", l.fingerprint},
                {"draining", l.draining},
                {"url", l.url},
                {"by_state", l.by_state},
                {"engines", l.engines},
                {"cores", l.cores},
                {"step_ms", l.step_ms},
                {"ctx", l.ctx},
                {"kv_by_tenant", l.kv_by_tenant},
                {"seq", l.seq},
                {"signals", l.signals}}
        .dump();
}

std::string text(std::mt19937_64 & rng, bool plain = false) {
    static const std::string alphabet[] = {"a",  "Z",  "0",  " ",    ":",    "/", "\"",
                                           "\\", "\n", "\t", "\x01", "\x1f", "é", "€"};
    std::string s;
    const size_t n = rng() % 8;
    for (size_t i = 0; i < n; ++i)
        s += alphabet[rng() % (plain ? 6 : std::size(alphabet))];
    return s;
}

//! A report of random fields; `plain`: its texts are printable ASCII without escapes.
NodeLoad random_load(std::mt19937_64 & rng, bool plain = false) {
    NodeLoad l;
    l.node = "n";
    l.free_seqs = int(rng() % 1000) - 10;
    l.kv_headroom = int64_t(rng()) >> (rng() % 64);
    l.kv_budget = int64_t(rng() % 100000);
    l.sessions = int(rng() % 600);
    l.version = text(rng, plain);
    l.fingerprint = text(rng, plain);
    l.draining = rng() % 2;
    l.url = text(rng, plain);
    for (size_t k = rng() % 4; k > 0; --k)
        l.by_state[text(rng, plain)] = int(rng() % 50) - 5;
    l.engines = int(rng() % 4);
    l.cores = int(rng() % 128);
    l.step_ms = rng() % 5 == 0 ? 0.0 : double(rng() % 100000) / double(1 + rng() % 1000);
    l.ctx = int64_t(rng() % 40000);
    for (size_t k = rng() % 4; k > 0; --k)
        l.kv_by_tenant[text(rng, plain)] = int64_t(rng() >> 4);
    l.seq = int64_t(rng() >> 1);
    l.signals.started_ms = int64_t(rng() >> 20);
    l.signals.steps = int64_t(rng() % 100000);
    l.signals.step_s = double(rng() % 1000000) / 7.0;
    l.signals.completed = int64_t(rng() % 1000);
    l.signals.failed = -int64_t(rng() % 3);
    for (size_t k = rng() % 3; k > 0; --k)
        l.signals.errors[text(rng, plain)] = int64_t(rng() % 10);
    l.signals.renew_late = int64_t(rng() % 5);
    l.signals.renew_failed = int64_t(rng() % 5);
    l.signals.lease_lost = int64_t(rng() % 5);
    return l;
}

}  // namespace

TEST(LoadEncoding, TheTextIsTheDocumentsBytesForAnyReport) {
    std::mt19937_64 rng(7);
    for (int i = 0; i < 2000; ++i) {
        const NodeLoad l = random_load(rng);
        ASSERT_EQ(encode_load(l), as_document(l)) << "report " << i;
        const auto back = decode_load("n", encode_load(l));
        ASSERT_TRUE(back);
        EXPECT_EQ(back->by_state, l.by_state);
        EXPECT_EQ(back->signals, l.signals);
        EXPECT_EQ(back->url, l.url);
        EXPECT_EQ(*back, *decode_load_json("n", encode_load(l)));
    }
}

TEST(LoadEncoding, TheOnePassReaderTakesEveryPlainReportAndReadsWhatTheParserReads) {
    std::mt19937_64 rng(11);
    for (int i = 0; i < 2000; ++i) {
        const NodeLoad l = random_load(rng, true);
        const std::string t = encode_load(l);
        const auto fast = decode_load_canonical("n", t);
        ASSERT_TRUE(fast) << "a report in encode_load's own form was not taken: " << t;
        EXPECT_EQ(*fast, l) << t;
        EXPECT_EQ(*fast, *decode_load_json("n", t)) << t;
    }
}

TEST(LoadEncoding, AnyTextTheOnePassReaderTakesTheParserReadsTheSame) {
    // Reports changed a byte or a few at a time (digits, signs, dots, quotes, braces, cuts): the
    // one-pass reader may refuse any of them, but what it takes must be what the parser reads.
    std::mt19937_64 rng(13);
    static const char bytes[] = "0123456789-+.eE\"\\{}:,x ";
    int taken = 0, differ = 0;
    for (int i = 0; i < 20000; ++i) {
        std::string t = encode_load(random_load(rng, rng() % 4 != 0));
        for (int n = 1 + int(rng() % 3); n > 0 && !t.empty(); --n) {
            const size_t at = rng() % t.size();
            switch (rng() % 4) {
                case 0:
                    t[at] = bytes[rng() % (sizeof bytes - 1)];
                    break;
                case 1:
                    t.insert(t.begin() + std::ptrdiff_t(at), bytes[rng() % (sizeof bytes - 1)]);
                    break;
                case 2:
                    t.erase(at, 1);
                    break;
                default:
                    t.resize(at);
            }
        }
        const auto fast = decode_load_canonical("n", t);
        if (!fast) continue;
        ++taken;
        const auto slow = decode_load_json("n", t);
        // Compared as written again too: == does not tell -0.0 from 0.0.
        if (!slow || !(*fast == *slow) || encode_load(*fast) != encode_load(*slow)) {
            ++differ;
            ADD_FAILURE() << "the one-pass reader took what the parser reads otherwise: " << t;
        }
        EXPECT_EQ(*decode_load("n", t), *fast);
    }
    EXPECT_EQ(differ, 0);
    EXPECT_GT(taken, 500) << "too few changed reports were taken for this to test anything";
}

TEST(LoadEncoding, WhatTheOnePassReaderRefusesTheParserStillReads) {
    NodeLoad l;
    l.node = "n";
    l.free_seqs = 8;
    l.url = "http://n1";
    const std::string t = encode_load(l);
    ASSERT_TRUE(decode_load_canonical("n", t));
    const auto differently = [&](const std::string & from, const std::string & to) {
        std::string u = t;
        const size_t at = u.find(from);
        EXPECT_NE(at, std::string::npos) << from;
        return u.replace(at, from.size(), to);
    };
    for (const std::string & other : {
             differently("\"free_seqs\":8", "\"free_seqs\":8.0"),                // a float where an integer goes
             differently("\"free_seqs\":8", "\"free_seqs\":3000000000"),         // beyond an int
             differently("\"url\":\"http://n1\"", "\"url\":\"http:\\/\\/n1\""),  // escapes
             differently("{\"by_state\"", "{ \"by_state\""),                     // spacing
             t + "\n",                                                           // a trailing newline
             differently("\"cores\":0,\"ctx\":0", "\"ctx\":0,\"cores\":0"),      // another order
         }) {
        EXPECT_FALSE(decode_load_canonical("n", other)) << other;
        const auto slow = decode_load_json("n", other);
        ASSERT_TRUE(slow) << other;
        EXPECT_EQ(*decode_load("n", other), *slow) << other;
    }
    EXPECT_EQ(decode_load("n", differently("\"url\":\"http://n1\"", "\"url\":\"http:\\/\\/n1\""))->url, "http://n1");
    // Leading zeros are not JSON: neither reader takes them.
    EXPECT_FALSE(decode_load("n", differently("\"free_seqs\":8", "\"free_seqs\":08")));
    // "-0" is the integer 0 to the parser: a float field reads it as +0.0, and so must decode_load.
    const std::string minus_zero = differently("\"step_ms\":0.0", "\"step_ms\":-0");
    EXPECT_FALSE(decode_load_canonical("n", minus_zero));
    EXPECT_FALSE(std::signbit(decode_load("n", minus_zero)->step_ms));
    EXPECT_TRUE(decode_load_canonical("n", differently("\"step_ms\":0.0", "\"step_ms\":-0.5")));
}

TEST(LoadEncoding, TextThatIsNotUtf8IsRefusedAsTheDocumentRefusedIt) {
    NodeLoad l;
    l.version = "\xff\xfe";
    EXPECT_THROW(encode_load(l), json::exception);
}

// A node's load report is written straight to text (encode_load): the bytes must be the ones a
// JSON document of the same fields dumps to, so that nothing reading etcd sees a change.
#include "cluster/membership.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

std::string text(std::mt19937_64 & rng) {
    static const std::string alphabet[] = {"a",  "Z",    "0",    "\"", "\\", "/", "\n",
                                           "\t", "\x01", "\x1f", "é",  "€",  " ", ":"};
    std::string s;
    const size_t n = rng() % 8;
    for (size_t i = 0; i < n; ++i)
        s += alphabet[rng() % std::size(alphabet)];
    return s;
}

}  // namespace

TEST(LoadEncoding, TheTextIsTheDocumentsBytesForAnyReport) {
    std::mt19937_64 rng(7);
    for (int i = 0; i < 2000; ++i) {
        NodeLoad l;
        l.free_seqs = int(rng() % 1000) - 10;
        l.kv_headroom = int64_t(rng()) >> (rng() % 64);
        l.kv_budget = int64_t(rng() % 100000);
        l.sessions = int(rng() % 600);
        l.version = text(rng);
        l.fingerprint = text(rng);
        l.draining = rng() % 2;
        l.url = text(rng);
        for (size_t k = rng() % 4; k > 0; --k)
            l.by_state[text(rng)] = int(rng() % 50) - 5;
        l.engines = int(rng() % 4);
        l.cores = int(rng() % 128);
        l.step_ms = double(rng() % 100000) / double(1 + rng() % 1000);
        l.ctx = int64_t(rng() % 40000);
        for (size_t k = rng() % 4; k > 0; --k)
            l.kv_by_tenant[text(rng)] = int64_t(rng() >> 4);
        l.seq = int64_t(rng() >> 1);
        l.signals.started_ms = int64_t(rng() >> 20);
        l.signals.steps = int64_t(rng() % 100000);
        l.signals.step_s = double(rng() % 1000000) / 7.0;
        l.signals.completed = int64_t(rng() % 1000);
        l.signals.failed = -int64_t(rng() % 3);
        for (size_t k = rng() % 3; k > 0; --k)
            l.signals.errors[text(rng)] = int64_t(rng() % 10);
        l.signals.renew_late = int64_t(rng() % 5);
        l.signals.renew_failed = int64_t(rng() % 5);
        l.signals.lease_lost = int64_t(rng() % 5);
        ASSERT_EQ(encode_load(l), as_document(l)) << "report " << i;
        const auto back = decode_load("n", encode_load(l));
        ASSERT_TRUE(back);
        EXPECT_EQ(back->by_state, l.by_state);
        EXPECT_EQ(back->signals, l.signals);
        EXPECT_EQ(back->url, l.url);
    }
}

TEST(LoadEncoding, TextThatIsNotUtf8IsRefusedAsTheDocumentRefusedIt) {
    NodeLoad l;
    l.version = "\xff\xfe";
    EXPECT_THROW(encode_load(l), json::exception);
}

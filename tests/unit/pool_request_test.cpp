// What a pool is sent (gateway/pool_request.h), what of its answer a client sees, and the latency
// class a request runs in (routing::RoutingConfig::latency_for).
#include "gateway/pool_request.h"
#include "api/errors.h"
#include "routing/pool_set.h"
#include "routing/rules.h"

#include <gtest/gtest.h>

using armada::api::ApiError;
using armada::api::json;
using armada::gateway::pool_request_body;
using armada::gateway::PoolRequestOptions;

namespace {

json chat_body(json extra = json::object()) {
    json b = {{"model", "cluster-model"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
    for (auto & [k, v] : extra.items())
        b[k] = v;
    return b;
}

int refusal_status(const json & body, const PoolRequestOptions & o) {
    try {
        (void)pool_request_body(body, o);
    } catch (const ApiError & e) {
        return e.status;
    }
    return 0;
}

//! A stream through the scrubber one byte at a time, then flushed.
std::string scrub_bytewise(const std::string & stream) {
    armada::gateway::PoolStreamScrubber sc;
    std::string out;
    for (char c : stream)
        out += sc.feed(std::string_view(&c, 1));
    return out + sc.flush();
}

}  // namespace

TEST(PoolRequest, OnlyKnownFieldsGoUpstreamWithTheUpstreamsModel) {
    PoolRequestOptions o;
    o.model = "tiny";
    const json sent = json::parse(pool_request_body(chat_body({{"ignore_eos", true},
                                                               {"id_slot", 3},
                                                               {"cache_prompt", false},
                                                               {"cache_salt", "mine"},
                                                               {"user", "u"},
                                                               {"temperature", 0.5},
                                                               {"max_tokens", 8},
                                                               {"stream", true}}),
                                                    o));
    for (const char * k : {"ignore_eos", "id_slot", "cache_prompt", "cache_salt", "user"})
        EXPECT_FALSE(sent.contains(k)) << k;
    EXPECT_EQ(sent["model"], "tiny");
    EXPECT_EQ(sent["temperature"], 0.5);
    EXPECT_EQ(sent["max_tokens"], 8);
    EXPECT_EQ(sent["stream"], true);
    EXPECT_EQ(sent["messages"].size(), 1u);
    // The tenant's salt, where the upstream takes one.
    o.cache_salt = armada::routing::tenant_cache_salt("t:acme");
    const json salted = json::parse(pool_request_body(chat_body({{"cache_salt", "theirs"}}), o));
    EXPECT_EQ(salted["cache_salt"], o.cache_salt);
    EXPECT_NE(armada::routing::tenant_cache_salt("t:acme"), armada::routing::tenant_cache_salt("t:beta"));
}

TEST(PoolRequest, WhatANodeRefusesIsRefusedWithTheSameStatus) {
    PoolRequestOptions o;
    o.model = "tiny";
    o.context = 1024;
    EXPECT_EQ(refusal_status(chat_body({{"n", 100}}), o), 400);
    EXPECT_EQ(refusal_status(chat_body({{"logprobs", true}, {"top_logprobs", 50}}), o), 400);
    EXPECT_EQ(refusal_status(chat_body({{"n_probs", 99}}), o), 400);
    EXPECT_EQ(refusal_status(chat_body({{"max_tokens", 5000}}), o), 400);
    EXPECT_EQ(refusal_status(chat_body({{"messages", json::array()}}), o), 400);
    EXPECT_EQ(refusal_status(chat_body({{"n", 2}, {"max_tokens", 16}}), o), 0);
    o.chat = false;
    EXPECT_EQ(refusal_status(json{{"prompt", json::array({1, -4})}}, o), 400);
    EXPECT_EQ(refusal_status(json{{"max_tokens", 4}}, o), 400);
    const json c = json::parse(pool_request_body(json{{"prompt", "once"}, {"n_probs", 3}, {"echo", true}}, o));
    EXPECT_EQ(c["prompt"], "once");
    EXPECT_EQ(c["logprobs"], 3);
    EXPECT_FALSE(c.contains("echo"));
    EXPECT_FALSE(c.contains("n_probs"));
}

TEST(PoolRequest, CacheFiguresAndTimingsNeverReachTheClientWholeOrStreamed) {
    const std::string whole = R"({"id":"x","timings":{"prompt_n":3,"cache_n":200},)"
                              R"("usage":{"prompt_tokens":203,"completion_tokens":1,"total_tokens":204,)"
                              R"("prompt_tokens_details":{"cached_tokens":200}}})";
    const json s = json::parse(armada::gateway::scrub_pool_json(whole));
    EXPECT_FALSE(s.contains("timings"));
    EXPECT_FALSE(s["usage"].contains("prompt_tokens_details"));
    EXPECT_EQ(s["usage"]["total_tokens"], 204);
    EXPECT_EQ(armada::gateway::scrub_pool_json("not json"), "not json");

    // A stream cut at every byte: the events come out whole and clean.
    const std::string stream =
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
        "data: {\"choices\":[],\"timings\":{\"cache_n\":200},\"usage\":{\"total_tokens\":5,"
        "\"prompt_tokens_details\":{\"cached_tokens\":200}}}\r\n\r\n"
        "data: [DONE]\n\n";
    const std::string out = scrub_bytewise(stream);
    EXPECT_EQ(out.find("timings"), std::string::npos) << out;
    EXPECT_EQ(out.find("cached_tokens"), std::string::npos) << out;
    EXPECT_NE(out.find("\"content\":\"a\""), std::string::npos) << out;
    EXPECT_NE(out.find("\"total_tokens\":5"), std::string::npos) << out;
    EXPECT_NE(out.find("data: [DONE]\n\n"), std::string::npos) << out;
}

TEST(PoolRequest, AnEventOfSeveralDataLinesIsScrubbedWholeOrLineByLine) {
    // Two chunks in one event (a client reading line by line takes each), and one chunk's JSON
    // spread over lines with CRLF endings (a client joining the lines takes it whole).
    const std::string stream =
        "data: {\"usage\":{\"cached_tokens\":1}}\ndata: {\"timings\":{\"a\":1},\"x\":2}\n\n"
        "data: {\"usage\":\r\ndata: {\"cached_tokens\":3},\"y\":4}\r\n\r\n";
    const std::string out = scrub_bytewise(stream);
    EXPECT_EQ(out.find("timings"), std::string::npos) << out;
    EXPECT_EQ(out.find("cached_tokens"), std::string::npos) << out;
    EXPECT_NE(out.find("\"x\":2"), std::string::npos) << out;
    EXPECT_NE(out.find("\"y\":4"), std::string::npos) << out;
}

TEST(PoolRequest, AClientMayLowerItsTenantsLatencyClassButRaiseItOnlyAsTheTenantAllows) {
    armada::routing::RoutingConfig rc;
    rc.tenant_latency["acme"] = "interactive";
    rc.tenant_latency_max["vip"] = "realtime";
    std::string why;
    EXPECT_EQ(rc.latency_for("acme", "", false, why), "interactive");
    EXPECT_EQ(rc.latency_for("other", "", false, why), "standard");
    EXPECT_EQ(rc.latency_for("acme", "batch", false, why), "batch");
    EXPECT_EQ(rc.latency_for("acme", "interactive", false, why), "interactive");
    EXPECT_FALSE(rc.latency_for("acme", "realtime", false, why));
    EXPECT_NE(why.find("more urgent"), std::string::npos);
    EXPECT_FALSE(rc.latency_for("other", "interactive", false, why));
    EXPECT_EQ(rc.latency_for("vip", "realtime", false, why), "realtime");
    EXPECT_EQ(rc.latency_for("other", "realtime", true, why), "realtime");  // an admin
    EXPECT_FALSE(rc.latency_for("acme", "warp", true, why));
    EXPECT_NE(why.find("not a latency class"), std::string::npos);
}

TEST(PoolRequest, ARuleMayNameTenantsForAPoolOfTheirOwn) {
    armada::routing::RouteRule r;
    r.tenant = {"acme"};
    r.to = "gpu-acme";
    r.name = "tenant=acme";
    armada::routing::RouteFacts f;
    f.tenant = "acme";
    EXPECT_EQ(armada::routing::choose_route({r}, f).target, "gpu-acme");
    f.tenant = "beta";
    EXPECT_EQ(armada::routing::choose_route({r}, f).target, "cpu");
}

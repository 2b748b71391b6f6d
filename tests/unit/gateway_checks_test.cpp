// The gateway's checks on client bytes (gateway/checks.h), and what `forward` refuses to write
// or to reuse, against a stand-in node that records every request it parses.
#include "fuzz/standin_node.h"
#include "gateway/checks.h"
#include "routing/upstream.h"

#include <gtest/gtest.h>

#include <string>

using armada::api::HttpRequest;
using armada::gateway::body_problem;
using armada::gateway::check_request;
using armada::routing::forward;

namespace {

HttpRequest get(const std::string & path, const std::string & query = {}) {
    HttpRequest r;
    r.method = "GET";
    r.path = path;
    r.query = query;
    return r;
}

}  // namespace

TEST(GatewayChecks, HeaderValuesWithLineBreaksOrNulAreRefused) {
    using armada::gateway::header_value_ok;
    EXPECT_TRUE(header_value_ok("Bearer abc\tdef"));
    EXPECT_FALSE(header_value_ok("12\r\nGET /admin HTTP/1.1"));
    EXPECT_FALSE(header_value_ok("12\n"));
    EXPECT_FALSE(header_value_ok("12\r"));
    EXPECT_FALSE(
        header_value_ok(std::string("1\0"
                                    "2",
                                    3)));
    EXPECT_FALSE(armada::gateway::header_name_ok("x-a:b"));
    EXPECT_FALSE(armada::gateway::header_name_ok(""));
    EXPECT_TRUE(armada::gateway::header_name_ok("x-request-id"));
    EXPECT_FALSE(armada::gateway::target_ok("/v1/x y"));
    EXPECT_FALSE(armada::gateway::target_ok("/v1/x\r\n"));
    EXPECT_FALSE(armada::gateway::target_ok("v1"));
    EXPECT_TRUE(armada::gateway::target_ok("/v1/sessions/sess_1/events?last_event_id=3"));
}

TEST(GatewayChecks, ALastEventIdFromTheQueryThatDecodesToALineBreakIsRefused) {
    const auto r = check_request(
        get("/v1/sessions/sess_abc/events", "last_event_id=1%0d%0aGET%20/v1/sessions/sess_x%20HTTP/1.1%0d%0a"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->reason.find("Last-Event-ID"), std::string::npos);
    EXPECT_FALSE(check_request(get("/v1/sessions/sess_abc/events", "last_event_id=12.3")));
    auto h = get("/v1/sessions/sess_abc/events");
    h.headers["last-event-id"] = "abc";
    EXPECT_TRUE(check_request(h));
}

TEST(GatewayChecks, IdsInThePathAreCheckedAgainstTheirGrammar) {
    EXPECT_FALSE(check_request(get("/v1/sessions/sess_0a9z")));
    EXPECT_FALSE(check_request(get("/v1/responses/resp_AbC09")));
    const auto s = check_request(get("/v1/sessions/sess%0d%0a"));
    ASSERT_TRUE(s);
    EXPECT_NE(s->reason.find("session id"), std::string::npos);
    EXPECT_TRUE(check_request(get("/v1/responses/resp.x")));
    EXPECT_TRUE(check_request(get("/v1/agents/a%2fb/sessions")));
    EXPECT_FALSE(check_request(get("/v1/agents/support.v2/sessions")));
}

TEST(GatewayChecks, AHeaderWithAControlByteIsRefusedAndNeverPassedOn) {
    auto r = get("/v1/models");
    r.headers["x-request-id"] = "a\rb";
    EXPECT_TRUE(check_request(r));
    const auto pass = armada::gateway::pass_headers(r);
    for (const auto & [k, v] : pass)
        EXPECT_NE(k, "x-request-id");
}

TEST(GatewayChecks, DeepNestingIsRefusedBeforeAnythingParsesIt) {
    const std::string deep(200000, '[');
    const auto why = body_problem(deep);
    ASSERT_TRUE(why);
    EXPECT_NE(why->find("nesting"), std::string::npos);
    std::string ok = std::string(64, '[') + std::string(64, ']');
    EXPECT_FALSE(body_problem(ok));
    std::string over = std::string(65, '[') + std::string(65, ']');
    EXPECT_TRUE(body_problem(over));
    // Brackets inside strings (escaped quotes too) are text, not nesting.
    EXPECT_FALSE(body_problem(R"({"a":")" + std::string(1000, '[') + R"(\"[[["})"));
}

TEST(GatewayChecks, InvalidUtf8TooManyValuesAndLongNamesAreRefused) {
    EXPECT_TRUE(body_problem("{\"a\":\"\xff\"}"));
    EXPECT_TRUE(body_problem("{\"a\":\"\xc0\xaf\"}"));      // overlong '/'
    EXPECT_TRUE(body_problem("{\"a\":\"\xed\xa0\x80\"}"));  // a surrogate
    EXPECT_FALSE(body_problem("{\"a\":\"h\xc3\xa9llo \xe4\xb8\xad \xf0\x9f\x98\x80\"}"));
    std::string many = "[";
    for (int i = 0; i < 1000; ++i)
        many += "1,";
    many += "1]";
    armada::gateway::BodyLimits lim;
    lim.max_values = 500;
    const auto m = body_problem(many, lim);
    ASSERT_TRUE(m);
    EXPECT_NE(m->find("values"), std::string::npos);
    lim = {};
    lim.max_key_bytes = 8;
    EXPECT_TRUE(body_problem(R"({"aaaaaaaaaaaa":1})", lim));
    EXPECT_FALSE(body_problem(R"({"a":"aaaaaaaaaaaa"})", lim));
    auto post = get("/v1/chat/completions");
    post.method = "POST";
    post.headers["content-type"] = "application/json";
    post.body = std::string(1000, '{');
    const auto r = check_request(post);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    // An agent declaration may be YAML, whose bytes a node repairs: its encoding passes on, its
    // nesting does not.
    auto agents = get("/v1/agents");
    agents.method = "POST";
    agents.body = "{\"id\":\"a\",\"x\":\"\x9a\x8d\"}";
    EXPECT_FALSE(check_request(agents));
    agents.body = std::string(100, '[');
    EXPECT_TRUE(check_request(agents));
}

TEST(GatewayForward, AHeaderValueWithALineBreakIsNeverWritten) {
    armada::testing::StandinNode node;
    ASSERT_FALSE(node.base().empty());
    const auto r = forward(node.base(), "GET", "/v1/sessions/s/events",
                           {{"Last-Event-ID", "1\r\nContent-Length: 0\r\n\r\nGET /admin HTTP/1.1\r\nX: y"}}, "", 3000);
    EXPECT_TRUE(r.invalid);
    EXPECT_FALSE(r.sent);
    EXPECT_EQ(r.status, 0);
    const auto t = forward(node.base(), "GET", "/v1/x HTTP/1.1\r\nHost: a\r\n\r\nGET /y", {}, "", 3000);
    EXPECT_TRUE(t.invalid);
    // A clean request afterwards does arrive, so the stand-in was listening all along.
    const auto ok = forward(node.base(), "GET", "/v1/models", {{"x-request-id", "abc"}}, "", 3000);
    EXPECT_EQ(ok.status, 200) << ok.error;
    EXPECT_EQ(node.wait_for(1), 1u);
    EXPECT_EQ(node.seen()[0].target, "/v1/models");
}

TEST(GatewayForward, AConnectionIsReusedOnlyAfterAWhole2xxAnswer) {
    armada::testing::StandinNode node;
    ASSERT_FALSE(node.base().empty());
    // 200, 200: the second request rides the first's connection.
    auto a = forward(node.base(), "GET", "/a", {}, "", 3000);
    auto b = forward(node.base(), "GET", "/b", {}, "", 3000);
    EXPECT_EQ(a.body, "req-1");
    EXPECT_EQ(b.body, "req-2");
    EXPECT_EQ(node.connections(), 1);
    // A 404 (with an unasked answer behind it): its connection is closed, so the next request
    // gets its own answer on a new connection, never the stray one.
    node.statuses({200, 200, 404, 200});
    auto c = forward(node.base(), "GET", "/c", {}, "", 3000);
    EXPECT_EQ(c.status, 404);
    EXPECT_EQ(c.body, "req-3");
    auto d = forward(node.base(), "GET", "/d", {}, "", 3000);
    EXPECT_EQ(d.status, 200);
    EXPECT_EQ(d.body, "req-4") << "c: " << c.body << " d: " << d.body;
    EXPECT_EQ(node.connections(), 2);
}

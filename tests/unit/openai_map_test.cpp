#include "api/openai_map.h"
#include "api/errors.h"

#include <gtest/gtest.h>

using namespace armada::api;

namespace {
const RequestLimits kLim;

int status_of(const json & body) {
    try {
        parse_chat(body, 1000, kLim);
    } catch (const ApiError & e) {
        return e.status;
    }
    return 200;
}

json chat(json extra = json::object()) {
    json j = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
    for (auto & [k, v] : extra.items())
        j[k] = v;
    return j;
}
}  // namespace

TEST(OpenAIMap, MinimalChat) {
    auto c = parse_chat(chat(), 1000, kLim);
    ASSERT_EQ(c.messages.size(), 1u);
    EXPECT_EQ(c.messages[0].role, "user");
    EXPECT_EQ(c.messages[0].content, "hi");
    EXPECT_EQ(c.sampling.n, 1);
    EXPECT_EQ(c.sampling.max_tokens, -1);
}

TEST(OpenAIMap, SamplingFields) {
    auto c = parse_chat(chat({{"temperature", 0},
                              {"top_p", 0.5},
                              {"seed", 7},
                              {"max_tokens", 12},
                              {"stop", "END"},
                              {"logit_bias", {{"5", -100}}},
                              {"frequency_penalty", 0.5}}),
                        1000, kLim);
    EXPECT_EQ(c.sampling.temperature, 0.0f);
    EXPECT_EQ(c.sampling.top_p, 0.5f);
    EXPECT_EQ(*c.sampling.seed, 7u);
    EXPECT_EQ(c.sampling.max_tokens, 12);
    ASSERT_EQ(c.sampling.stop.size(), 1u);
    ASSERT_EQ(c.sampling.logit_bias.size(), 1u);
    EXPECT_EQ(c.sampling.logit_bias[0].token, 5);
}

TEST(OpenAIMap, BadRequestsAre400) {
    EXPECT_EQ(status_of(json{{"messages", json::array()}}), 400);
    EXPECT_EQ(status_of(json{{"messages", "hi"}}), 400);
    EXPECT_EQ(status_of(json{{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}), 400);
    EXPECT_EQ(status_of(chat({{"logit_bias", {{"999999", 1}}}})), 400);
    EXPECT_EQ(status_of(chat({{"logit_bias", {{"abc", 1}}}})), 400);
    EXPECT_EQ(status_of(chat({{"logit_bias", {{"-1", 1}}}})), 400);
    EXPECT_EQ(status_of(chat({{"max_tokens", -5}})), 400);
    EXPECT_EQ(status_of(chat({{"n", 1000}})), 400);
    EXPECT_EQ(status_of(chat({{"temperature", "hot"}})), 400);
    EXPECT_EQ(status_of(chat({{"stop", json::array({1, 2})}})), 400);
    EXPECT_EQ(status_of(chat({{"tool_choice", "required"}})), 400);
}

TEST(OpenAIMap, ToolResultWithoutCallIs400) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "x"}},
                                           {{"role", "tool"}, {"tool_call_id", "nope"}, {"content", "r"}}})}};
    EXPECT_EQ(status_of(body), 400);
}

TEST(OpenAIMap, ToolsAndChoice) {
    json tool = {{"type", "function"},
                 {"function", {{"name", "get"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}};
    json tool2 = tool;
    tool2["function"]["name"] = "put";
    auto c = parse_chat(chat({{"tools", json::array({tool, tool2})},
                              {"tool_choice", {{"type", "function"}, {"function", {{"name", "put"}}}}}}),
                        1000, kLim);
    ASSERT_EQ(c.tools.size(), 1u);
    EXPECT_EQ(c.tools[0].name, "put");
    EXPECT_EQ(c.tool_choice, COMMON_CHAT_TOOL_CHOICE_REQUIRED);
    EXPECT_EQ(status_of(chat({{"tools", json::array({tool, tool})}})), 400);  // duplicate names
    json bad = tool;
    bad["function"]["parameters"] = "not a schema";
    EXPECT_EQ(status_of(chat({{"tools", json::array({bad})}})), 400);
}

TEST(OpenAIMap, AssistantToolCallsRoundTrip) {
    json body = {
        {"messages", json::array({{{"role", "user"}, {"content", "x"}},
                                  {{"role", "assistant"},
                                   {"content", nullptr},
                                   {"tool_calls", json::array({{{"id", "c1"},
                                                                {"type", "function"},
                                                                {"function", {{"name", "f"}, {"arguments", "{}"}}}}})}},
                                  {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}})}};
    auto c = parse_chat(body, 1000, kLim);
    ASSERT_EQ(c.messages[1].tool_calls.size(), 1u);
    EXPECT_EQ(c.messages[1].tool_calls[0].name, "f");
    EXPECT_EQ(c.messages[2].tool_call_id, "c1");
}

TEST(JsonBody, DepthLimit) {
    std::string deep(100000, '[');
    deep = "{\"a\":" + deep;
    try {
        parse_request_body(deep);
        FAIL();
    } catch (const ApiError & e) {
        EXPECT_EQ(e.status, 400);
    }
    EXPECT_THROW(parse_request_body("{\"a\":"), ApiError);
    EXPECT_THROW(parse_request_body("[1]"), ApiError);
    EXPECT_NO_THROW(parse_request_body("{\"a\":[[1]]}"));
}

TEST(JsonBody, ErrorShape) {
    auto j = json::parse(error_body(400, "bad \xFF thing", "messages"));
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], "messages");
    EXPECT_TRUE(j["error"]["code"].is_null());
}

// MCP server replies read without trusting them: wrong shapes become errors or are skipped.
#include "tools/mcp_messages.h"

#include <gtest/gtest.h>

using namespace armada::tools;
using json = nlohmann::json;

TEST(McpMessages, ReadsAnswersFromJsonAndSse) {
    std::string err;
    json r = mcp_answer(200, R"({"jsonrpc":"2.0","id":3,"result":{"protocolVersion":"2025-11-25"}})",
                        "application/json", json(3), err);
    EXPECT_EQ(err, "");
    EXPECT_EQ(mcp_protocol_version(r), "2025-11-25");
    // SSE: other messages first, the answer split over two data lines.
    r = mcp_answer(200,
                   "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"
                   "data: {\"jsonrpc\":\"2.0\",\"id\":3,\r\ndata: \"result\":{\"tools\":[]}}\r\n\r\n",
                   "text/event-stream", json(3), err);
    EXPECT_EQ(err, "");
    EXPECT_TRUE(r.contains("tools"));
}

TEST(McpMessages, ErrorsOfAnyShapeBecomeMessages) {
    std::string err;
    EXPECT_TRUE(
        mcp_answer(200, R"({"id":1,"error":{"code":-32602,"message":"bad args"}})", "application/json", json(1), err)
            .is_null());
    EXPECT_EQ(err, "MCP error -32602: bad args");
    err.clear();
    EXPECT_TRUE(mcp_answer(200, R"({"id":1,"error":5})", "application/json", json(1), err).is_null());
    EXPECT_EQ(err, "MCP error: 5");
    err.clear();
    EXPECT_TRUE(mcp_answer(404, R"({"error":"gone"})", "application/json", json(1), err).is_null());
    EXPECT_EQ(err, "the MCP server answered HTTP 404: (malformed error)");
    err.clear();
    EXPECT_TRUE(mcp_answer(200, "not json", "application/json", json(1), err).is_null());
    EXPECT_EQ(err, "the MCP server sent no JSON-RPC answer");
    err.clear();
    EXPECT_TRUE(mcp_answer(200, R"({"id":1,"result":[1]})", "application/json", json(1), err).is_null());
    EXPECT_EQ(err, "the MCP server's result is not an object");
    EXPECT_EQ(mcp_protocol_version(json{{"protocolVersion", 20251125}}), "");
}

TEST(McpMessages, ToolListsAndResultsOfTheWrongShapeAreSkipped) {
    std::vector<armada::tools::HttpToolSpec> tools;
    std::string cursor;
    mcp_tools_page(json::parse(R"({"tools":[1,"x",{"name":3},{"name":"ok","inputSchema":[]},
        {"name":"full","description":"d","inputSchema":{"type":"object"}}],"nextCursor":5})"),
                   {}, tools, cursor);
    ASSERT_EQ(tools.size(), 2u);
    EXPECT_EQ(tools[0].name, "ok");
    EXPECT_EQ(tools[0].parameters, R"({"type":"object"})");
    EXPECT_EQ(tools[1].description, "d");
    EXPECT_EQ(cursor, "");  // a cursor that is not a string ends the listing
    tools.clear();
    mcp_tools_page(json::parse(R"({"tools":{"name":"x"},"nextCursor":"p2"})"), {}, tools, cursor);
    EXPECT_TRUE(tools.empty());
    EXPECT_EQ(cursor, "p2");

    ToolResult r = mcp_call_result(json::parse(R"({"content":[{"type":"text","text":"a"},7,{"type":"image"},
        {"type":"text","text":5}],"structuredContent":{"k":1},"isError":"yes"})"));
    EXPECT_EQ(r.content, "a\n[content]\n[image]\n\n{\"k\":1}");
    EXPECT_FALSE(r.is_error);  // only a real true is an error
    r = mcp_call_result(json::parse(R"({"content":"text","isError":true})"));
    EXPECT_EQ(r.content, "");
    EXPECT_TRUE(r.is_error);
}

// Replies of an MCP server: the first byte picks JSON or SSE framing and the HTTP status, the
// rest is the body. Nothing may throw; a refusal says why.
#include "tools/mcp_messages.h"

#include <cstdlib>

using namespace armada::tools;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size == 0) return 0;
    const bool sse = data[0] & 1;
    const int status = (data[0] & 2) ? 400 + (data[0] >> 2) : 200;
    const std::string body(reinterpret_cast<const char *>(data + 1), size - 1);
    std::string err;
    const nlohmann::json res =
        mcp_answer(status, body, sse ? "text/event-stream" : "application/json", nlohmann::json(7), err);
    if (res.is_null() == err.empty()) std::abort();  // exactly one of an answer and a reason
    std::vector<armada::tools::HttpToolSpec> tools;
    std::string cursor;
    mcp_tools_page(res, {}, tools, cursor);
    mcp_tools_page(res, {"a"}, tools, cursor);
    for (const auto & t : tools) {
        if (t.name.empty() || !nlohmann::json::accept(t.parameters)) std::abort();
    }
    mcp_call_result(res);
    mcp_protocol_version(res);
    return 0;
}

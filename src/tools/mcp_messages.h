#pragma once

#include "tools/tool_spec.h"
#include "tools/tool_transport.h"

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

namespace armada::tools {

//! What an MCP server sends back, read without trusting it: every function here takes any bytes
//! or any JSON and never throws; what does not have the expected shape becomes an error message
//! or is skipped.

//! The JSON-RPC answer to request `id` in an HTTP reply (a JSON body or an SSE stream). On
//! failure returns null and sets `err`. `status` is the HTTP status.
nlohmann::json mcp_answer(int status, const std::string & body, const std::string & content_type,
                          const nlohmann::json & id, std::string & err);

//! One page of `tools/list`: appends the tools named in `allowed` (all when empty) and sets
//! `cursor` to the next page's cursor ("" at the end).
void mcp_tools_page(const nlohmann::json & result, const std::set<std::string> & allowed,
                    std::vector<HttpToolSpec> & out, std::string & cursor);

//! A `tools/call` result as the model will see it.
ToolResult mcp_call_result(const nlohmann::json & result);

//! `protocolVersion` of an initialize result, "" when absent or not a string.
std::string mcp_protocol_version(const nlohmann::json & result);

}  // namespace armada::tools

#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace armada::tools {

//! An HTTP tool: the model's arguments are POSTed as JSON to `url`.
struct HttpToolSpec {
    std::string name;
    std::string description;
    std::string parameters;  // JSON Schema, serialised
    std::string url;
    std::string method = "POST";
    //! Header values as written. In agents from the operator's `--agents` file (`expand_secrets`),
    //! `${env:NAME}` and `${file:/path}` are resolved when the call is made, so secrets never
    //! enter the spec, the transcript or the model's prompt. Anything else is sent literally.
    std::map<std::string, std::string> headers;
    bool expand_secrets = false;
    //! Redirects within the same origin (scheme, host, port) are followed; one to another origin
    //! is followed without the spec's headers, `Authorization` and `Cookie`. false: none is.
    bool follow_redirects = true;
    int32_t timeout_ms = 10000;
    int32_t retries = 0;
    int32_t max_body = 64 * 1024;
    //! Set for tools imported from an MCP server: calls go there as tools/call.
    std::string mcp_url;
};

//! An MCP server whose tools an agent imports, or that a Responses request names (Streamable
//! HTTP).
struct McpServerSpec {
    std::string url;
    std::vector<std::string> allowed_tools;  // empty: all
    std::map<std::string, std::string> headers;
    bool expand_secrets = false;  // as HttpToolSpec: only for the operator's agents
    bool follow_redirects = true;
    int32_t timeout_ms = 30000;
};

}  // namespace armada::tools

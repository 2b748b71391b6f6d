#pragma once

#include "engine/sampling.h"
#include "tools/tool_spec.h"

#include <chat.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace armada::agent {

using tools::HttpToolSpec;
using tools::McpServerSpec;

//! Limits that end a session as failed when reached.
struct AgentLimits {
    int32_t max_steps = 16;  // model steps
    int32_t max_tokens_per_step = 512;
    int64_t token_budget = 0;         // prompt + generated tokens over the session; 0 = none
    int32_t tool_timeout_ms = 30000;  // cap on any single tool call
    int32_t deadline_s = 0;           // wall time from creation; 0 = none
    //! Per-session memory cap: the prompt of a step may hold at most this many tokens, and its
    //! KV at most this many bytes (0 = only the sequence's context limits it).
    int32_t max_context_tokens = 0;
    int64_t max_kv_bytes = 0;
    //! Compaction at the cap: tool outputs older than the newest N are replaced by a short note
    //! in the prompt (the stored transcript keeps them). -1: no compaction, the session fails.
    int32_t keep_tool_outputs = -1;
};

//! A declared agent.
struct AgentSpec {
    std::string id;
    std::string model;
    std::string instructions;
    std::vector<HttpToolSpec> tools;
    std::vector<McpServerSpec> mcp_servers;  // their tools are added to `tools` when imported
    engine::SamplingOptions sampling;
    common_chat_tool_choice tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    //! The first N model steps must call a tool (tool_choice required); after that the agent's
    //! own tool_choice applies. Useful for workloads with a known shape and for random-weight
    //! test models.
    int32_t min_tool_steps = 0;
    //! After min_tool_steps, the step that answers is generated with tools off.
    bool answer_without_tools = false;
    bool parallel_tool_calls = true;
    //! The step that reads a result of one of these tools is long (a document to summarise, say):
    //! when the node has GPU pools, the routing rule `long_step` sends it there.
    std::vector<std::string> long_after_tools;
    AgentLimits limits;
    //! The declaration as canonical JSON (what was written, YAML read as JSON types). An agent
    //! declared through the API is stored as this and parsed again from it after a restart.
    std::string source;
    //! Declared by the operator (`--agents`): visible to every tenant, read-only over the API.
    bool from_operator = false;
    //! The tenant an API-declared agent belongs to.
    std::string tenant;
};

//! Where the text comes from. Only the operator's file may use `${env:…}` and `${file:…}`
//! references; in anything a client sends they are refused.
struct ParseOptions {
    bool from_operator = false;
    //! The text is an agent stored by an older Armada, which wrote every scalar double-quoted:
    //! scalars that read as numbers or booleans are taken as such despite their quotes.
    bool legacy_quoted = false;
};

//! Parses agents from YAML (JSON is accepted too): either a list or a map with an `agents`
//! list. Returns an error naming the field and the reason, e.g.
//! "agents[0].tools[1].parameters: must be an object"; empty on success.
std::string parse_agents(const std::string & text, std::vector<AgentSpec> & out, const ParseOptions & opt = {});

//! True when `value` holds a `${env:…}` or `${file:…}` reference.
bool has_secret_reference(const std::string & value);

}  // namespace armada::agent

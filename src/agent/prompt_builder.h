#pragma once

// What an agent step's prompt is made of, as pure functions of the agent and its transcript: the
// system message, the transcript with tool outputs labelled as untrusted data (and the oldest ones
// replaced by a note when the session is compacted), the tools and tool choice, the session's
// memory cap, and the prefix every session of one agent shares. The session manager renders the
// messages with the model's chat template (engine::ChatFormat) and decides when to compact; these
// say what.
//
// Owns: nothing stateful. It includes agent_spec.h and the engine's chat types only.

#include "agent/agent_spec.h"
#include "engine/chat_format.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace armada::agent {

//! A tool's output as the model sees it: inside a `<tool_output … trust="untrusted">` envelope
//! that nothing in the output can close, with chat-template control tokens ("<|…") broken up.
std::string label_tool_output(const std::string & tool, const std::string & content);

//! The agent's system message: its instructions and, when it has tools, the note that tool
//! output is untrusted data. None when both are empty.
std::optional<common_chat_msg> system_message(const AgentSpec & a);

//! The prompt's messages: the system message, then the transcript with each tool output
//! labelled, the oldest `dropped` of them replaced by a note (compaction; the stored transcript
//! keeps them).
std::vector<common_chat_msg> prompt_messages(const AgentSpec & a, const std::vector<common_chat_msg> & transcript,
                                             int32_t dropped);

//! The agent's tools as the chat template takes them.
std::vector<common_chat_tool> prompt_tools(const AgentSpec & a);

//! The tool choice of the step after `model_steps` steps: required until the agent's
//! min_tool_steps are done, then none when it answers without tools, else the agent's own.
common_chat_tool_choice step_tool_choice(const AgentSpec & a, int32_t model_steps);

//! Tokens the next step's prompt may hold on a sequence of `ctx` tokens: one less than the
//! context, within the agent's max_context_tokens and max_kv_bytes (at `kv_bytes_per_token`).
int64_t memory_cap(const AgentLimits & l, int64_t ctx, uint64_t kv_bytes_per_token);

//! How many of the oldest tool outputs compaction replaces so that the newest `keep` stay
//! (negative `keep`: the agent does not compact, 0).
int32_t tool_outputs_to_drop(const std::vector<common_chat_msg> & transcript, int32_t keep);

//! Whether the step reads the output of a tool the agent marks as making the next step long
//! (`long_after_tools`): the tool outputs at the end of the transcript.
bool reads_long_tool_output(const AgentSpec & a, const std::vector<common_chat_msg> & transcript);

//! The tokens two renders share from their start: rendered with two different user messages,
//! what an agent's sessions all begin with (its instructions and tool schemas).
engine::Tokens common_prefix(const engine::Tokens & x, const engine::Tokens & y);

//! How much of `prompt` the engine may cache as shared by the agent's sessions: all of `prefix`
//! when the prompt begins with it and goes past it, and the prefix is long enough to be worth it
//! (16 tokens); else 0.
int32_t shared_prefix_length(const engine::Tokens & prefix, const engine::Tokens & prompt);

}  // namespace armada::agent

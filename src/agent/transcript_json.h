#pragma once

// A transcript's messages as JSON: the form of the messages in a session's view and stream
// (OpenAI's chat messages), and the assistant message a `model_output` step's payload records.

#include "engine/chat_format.h"

#include <nlohmann/json.hpp>

namespace armada::agent {

//! An OpenAI-style message: role, content (null beside tool calls), tool_calls, tool_call_id,
//! and the tool's name for a tool's output.
nlohmann::json message_json(const common_chat_msg & m);

//! The assistant message a model_output step's payload records: its content and tool calls
//! (fields of another type read as empty).
common_chat_msg assistant_message(const nlohmann::json & payload);

}  // namespace armada::agent

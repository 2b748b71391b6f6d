#pragma once

// The Responses API's conversation: the request's input items as chat messages, and the stored
// form of a conversation that a later response (`previous_response_id`) continues.

#include "api/json_util.h"
#include "engine/chat_format.h"

#include <vector>

namespace armada::api {

//! Appends `input` (a string, or a list of message, function_call and function_call_output
//! items) to `msgs`. Consecutive function_call items become one assistant message. Throws
//! ApiError (400) for anything else.
void append_input(const json & input, std::vector<common_chat_msg> & msgs);

//! A conversation as it is stored with its response, and back.
json msgs_to_json(const std::vector<common_chat_msg> & msgs);
std::vector<common_chat_msg> msgs_from_json(const json & a);

}  // namespace armada::api

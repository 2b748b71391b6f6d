#pragma once

// A session as a gateway creates it, before any node holds it, and the id every session gets.

#include "store/store.h"

#include <cstdint>
#include <string>

namespace armada::store {

//! A new session id: "sess_" and 20 random characters of [a-z0-9] (about 103 bits).
std::string new_session_id();

//! The row and first step of a new session in `cell`: state queued with its input as step 1, or
//! waiting_input (step 1 says so) without one. The node that adopts it starts it as it starts a
//! session resumed after a restart.
Batch new_session_batch(const std::string & id, const std::string & agent_id, const std::string & tenant,
                        const std::string & input, const std::string & cell, int64_t now_ms);

}  // namespace armada::store

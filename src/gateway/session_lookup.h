#pragma once

#include "store/store.h"

#include <functional>
#include <optional>
#include <string>

namespace armada::gateway {

//! Session `id`'s row as the store has it now. A row that is not there is nullopt; a store that
//! cannot be read (PostgreSQL restarting, its read pool exhausted) is nullopt with `unavailable`
//! set, so that a client is told to retry rather than that its session does not exist. `renew`
//! is tried once when a read fails (it clears a broken connection; true when the store works).
std::optional<store::SessionRecord> lookup_session(store::SessionLog & st, const std::string & id,
                                                   const std::function<bool()> & renew, bool & unavailable);

}  // namespace armada::gateway

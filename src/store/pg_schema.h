#pragma once

// The store's PostgreSQL schema: numbered migrations, applied at open (inside store/ only).

#include <libpq-fe.h>

#include <string>

namespace armada::store::pg {

//! The schema version this build writes.
int latest_schema();
//! Brings the database `c` is connected to up to `latest_schema()`; "" on success. Nodes that
//! start together each call it: one applies each step, the others find it done.
std::string migrate(PGconn * c);

}  // namespace armada::store::pg

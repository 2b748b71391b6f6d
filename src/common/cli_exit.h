#pragma once

// The one way an `armada` command ends on an error it explains: `error: WHAT` on stderr, and exit
// status 1, or 2 when the command was given wrong arguments or settings (as CLI11's own usage
// errors exit).

#include <cstdio>
#include <string>

namespace armada::common {

//! Prints `error: what` to stderr; returns the exit status to return from the command: 1, or
//! `status` (2: wrong arguments or settings).
inline int fail(const std::string & what, int status = 1) {
    std::fprintf(stderr, "error: %s\n", what.c_str());
    return status;
}

}  // namespace armada::common

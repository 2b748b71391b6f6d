#pragma once

// The one way an `armada` command ends on an error it explains: `error: WHAT` on stderr and exit
// status 1 (usage errors, which CLI11 reports, exit 2).

#include <cstdio>
#include <string>

namespace armada::common {

//! Prints `error: what` to stderr; returns the exit status to return from the command (1).
inline int fail(const std::string & what) {
    std::fprintf(stderr, "error: %s\n", what.c_str());
    return 1;
}

}  // namespace armada::common

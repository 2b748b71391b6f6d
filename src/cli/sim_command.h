#pragma once

#include <cstdint>
#include <string>

namespace armada::cli {

struct SimCommandOptions {
    std::string scenario;  // YAML file
    uint64_t seed = 1;
    int seeds = 1;      // a sweep: seeds seed .. seed+seeds-1, invariants only
    std::string out;    // directory for result.json, result.md and plot.svg
    std::string trace;  // file for the event trace's text
    //! Checks docs/SCALE.md's goals on a single run, not only the invariants: exit 1 when one is
    //! missed, saying which.
    bool goals = false;
};

//! `armada sim`: runs a scenario on the real brains in the deterministic simulator. Prints a
//! summary; exits 1 when an invariant failed (with the command that replays the seed).
int sim_command(const SimCommandOptions & o);

}  // namespace armada::cli

#pragma once

// Chain survival: the share of agent sessions that ran from scheduling to completion, the
// sources' key signal. Client cancels count on neither side.

#include "store/store.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace armada::cluster {

struct Survival {
    int64_t completed = 0;
    int64_t failed = 0;     // the agent or the model gave up (errors, max_steps, token budget)
    int64_t timed_out = 0;  // the agent's deadline passed
    int64_t lost = 0;       // failed after the session had moved (a failover, drain, rebalance or re-home)
    int64_t cancelled = 0;  // by the client: not a lost chain
    //! completed / (completed + failed + timed_out + lost); NaN when none of those ended.
    double ratio() const;
    void add(const store::SessionQueries::EndedCount & c);
};

//! The counts of `rows` by cell, and for all of them under "".
std::map<std::string, Survival> survival_by_cell(const std::vector<store::SessionQueries::EndedCount> & rows);

}  // namespace armada::cluster

#pragma once

// The process's clocks, in the units the code keeps: steady milliseconds for intervals and
// deadlines, wall milliseconds and seconds for times written down or sent. Code that tests or
// the simulator must drive takes a `cluster::Clock` instead.

#include <chrono>
#include <cstdint>

namespace armada::common {

inline int64_t steady_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

inline int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

//! Seconds since the Unix epoch (OpenAI's `created`).
inline int64_t unix_s() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

}  // namespace armada::common

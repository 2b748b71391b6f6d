#pragma once

// The one back-off: pauses that double from a first value up to a cap, and jitter (a random 0.5
// to 1.5 times the pause), so that processes or sessions that failed together do not come back
// in step.

#include <algorithm>
#include <cstdint>
#include <random>

namespace armada::common {

//! The `n`-th pause (n from 0) of a back-off that starts at `first_ms` and doubles up to `max_ms`.
inline int64_t backoff_ms(int64_t first_ms, int n, int64_t max_ms) {
    return std::min(max_ms, first_ms << std::clamp(n, 0, 20));
}

//! `ms` times a random 0.5..1.5 (this thread's own generator).
inline int jittered_ms(int ms) {
    thread_local std::mt19937 rng(std::random_device{}());
    return std::uniform_int_distribution<int>(ms / 2, ms + ms / 2)(rng);
}

//! A back-off with state: each failure's pause, jittered, doubling from `first_ms` up to
//! `max_ms`; a success starts it over. Seeded, so that a test or the simulator replays it.
class Backoff {
  public:
    explicit Backoff(int first_ms = 250, int max_ms = 4000, uint64_t seed = std::random_device{}())
        : first_(first_ms), max_(max_ms), next_(first_ms), rng_(seed) {}
    //! The pause before the next try, and doubles the one after.
    int next_ms() {
        const int base = next_;
        next_ = std::min(next_ * 2, max_);
        return std::uniform_int_distribution<int>(base / 2, base + base / 2)(rng_);
    }
    void reset() { next_ = first_; }
    //! The base of the next pause (before its jitter).
    int base_ms() const { return next_; }

  private:
    int first_, max_, next_;
    std::mt19937_64 rng_;
};

}  // namespace armada::common

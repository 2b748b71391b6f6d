#pragma once

// The one back-off of the cluster's runners: a pause that doubles from `first_ms` up to `max_ms`
// after each failure, drawn at random from half to one and a half times its value, so that
// processes that lost a server together do not come back in step. A success starts it over.

#include <algorithm>
#include <cstdint>
#include <random>

namespace armada::cluster {

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

}  // namespace armada::cluster

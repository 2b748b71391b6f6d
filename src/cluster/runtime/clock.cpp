#include "cluster/runtime/clock.h"

#include "common/clock.h"

#include <chrono>

namespace armada::cluster {

namespace {

class RealClock final : public Clock {
  public:
    int64_t now_ms() const override { return common::steady_ms(); }
    int64_t wall_ms() const override { return common::wall_ms(); }
};

}  // namespace

Clock & real_clock() {
    static RealClock c;
    return c;
}

}  // namespace armada::cluster

#include "cluster/runtime/clock.h"

#include <chrono>

namespace armada::cluster {

namespace {

class RealClock final : public Clock {
  public:
    int64_t now_ms() const override {
        using namespace std::chrono;
        return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
    }
    int64_t wall_ms() const override {
        using namespace std::chrono;
        return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
    }
};

}  // namespace

Clock & real_clock() {
    static RealClock c;
    return c;
}

}  // namespace armada::cluster

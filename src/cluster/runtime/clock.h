#pragma once

// The one clock of the cluster's runners. The processes use the real one; unit tests and the
// simulator set the time themselves, so a runner's timers (reconcile, report, back-off, a lease
// check) run the same code under both.

#include <atomic>
#include <cstdint>

namespace armada::cluster {

class Clock {
  public:
    virtual ~Clock() = default;
    //! Monotonic milliseconds: intervals, deadlines, back-off.
    virtual int64_t now_ms() const = 0;
    //! Milliseconds since the Unix epoch: what is written down for people and for other hosts.
    virtual int64_t wall_ms() const = 0;
};

//! The process's clocks (steady and system).
Clock & real_clock();

//! A clock that moves only when told to (tests, the simulator). Safe to read from any thread.
class ManualClock : public Clock {
  public:
    explicit ManualClock(int64_t start_ms = 1'000'000, int64_t wall_offset_ms = 1'700'000'000'000)
        : now_(start_ms), wall_offset_(wall_offset_ms) {}
    int64_t now_ms() const override { return now_.load(); }
    int64_t wall_ms() const override { return now_.load() + wall_offset_; }
    void advance(int64_t ms) { now_ += ms; }
    void set(int64_t ms) { now_ = ms; }

  private:
    std::atomic<int64_t> now_;
    int64_t wall_offset_;
};

}  // namespace armada::cluster

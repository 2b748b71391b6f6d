#pragma once

#include "store/store.h"

#include <atomic>
#include <mutex>
#include <random>

namespace armada::testing {

//! Wraps a real store and makes commits fail: the next `fail_next` ones, then each with
//! probability `p` (seeded). "Disk full" fails every commit until cleared. A failure is sticky
//! like a real one: later commits fail until `recover` is called.
class FaultStore : public store::ForwardingStore {
  public:
    explicit FaultStore(store::Store & inner, double p = 0, uint32_t seed = 1)
        : ForwardingStore(inner), p_(p), rng_(seed) {}

    std::atomic<int> fail_next{0};
    std::atomic<bool> disk_full{false};
    std::atomic<int> failures{0};

    void commit(store::Batch b, std::function<void(store::Status)> done) override {
        bool fail = false;
        {
            std::lock_guard lk(mu_);
            if (sticky_ || disk_full || fail_next > 0 || std::uniform_real_distribution<double>(0, 1)(rng_) < p_) {
                fail = true;
                sticky_ = true;
                if (fail_next > 0) --fail_next;
            }
        }
        if (fail) {
            ++failures;
            done(store::Status::Error(disk_full ? "disk full (injected)" : "write failed (injected)"));
            return;
        }
        inner_.commit(std::move(b), std::move(done));
    }
    store::Status recover() override {
        std::lock_guard lk(mu_);
        if (disk_full) return store::Status::Error("disk full (injected)");
        sticky_ = false;
        return inner_.recover();
    }

    store::Status writable() override {
        std::lock_guard lk(mu_);
        if (sticky_ || disk_full) return store::Status::Error(disk_full ? "disk full (injected)" : "write failed (injected)");
        return inner_.writable();
    }

  private:
    double p_;
    std::mt19937 rng_;
    std::mutex mu_;
    bool sticky_ = false;
};

}  // namespace armada::testing

#pragma once

#include "store/store.h"

#include <unistd.h>
#include <atomic>
#include <cstdlib>

namespace armada::store {

//! A test hook: the process dies (as SIGKILL would leave it, no cleanup) right after the N-th
//! commit becomes durable, before anyone hears that it did. `armada serve` wraps its store in
//! one when ARMADA_CRASH_AFTER_COMMITS=N is set, so a black-box test can crash the node at each
//! checkpoint boundary in turn.
class CrashAfterCommits : public ForwardingStore {
  public:
    CrashAfterCommits(Store & inner, long n) : ForwardingStore(inner), left_(n) {}

    void commit(Batch batch, std::function<void(Status)> done) override {
        inner_.commit(std::move(batch), [this, done = std::move(done)](Status s) {
            if (s.ok && --left_ == 0) {
                static const char msg[] = "armada: crashing after a commit (ARMADA_CRASH_AFTER_COMMITS)\n";
                (void)!::write(2, msg, sizeof msg - 1);
                std::_Exit(137);
            }
            done(s);
        });
    }

  private:
    std::atomic<long> left_;
};

}  // namespace armada::store

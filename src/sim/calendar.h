#pragma once

// The simulator's clock: the kinds of events, and the calendar that hands them out in time order.
// Private to src/sim/.

#include <cstdint>
#include <map>
#include <vector>

namespace armada::sim::detail {

enum Kind : uint8_t {
    kArrive,     // a: tenant
    kPlaceMsg,   // a: session, b: cell, c: epoch (a place request reaches the cell's queue)
    kRunMsg,     // a: session, b: node, c: epoch (a run command reaches the node)
    kClosedMsg,  // a: session, b: cell (a node's "ended" event reaches the cell)
    kEnd,        // a: session, b: run counter (its last step is done)
    kReport,     // a: node
    kCellTick,   // a: cell
    kGlobalTick,
    kLeaseCheck,  // a: node, b: lease generation (its last keepalive + TTL)
    kFault,       // a: fault index
    kWake,        // a: node (a hang ends)
    kRestart,     // a: node (a crashed node starts again)
    kBrainUp,     // a: cell (a standby leads)
    kCellBack,    // a: cell (a lost cell's processes start again)
    kEtcdUp,
    kSecond,
    kMovable,     // a: session, b: node (a draining node offers it to its cell brain, between steps)
    kDrainCheck,  // a: node, b: its drain's number (empty yet, or past the drain timeout?)
    kHeal,        // a: node (a partition ends)
    kDiskOk,      // a: node (a slow disk is fast again)
    kNatsUp,      // NATS can be reached again
    kRetryOpen,   // a: tenant (a client whose session could not be created tries again)
    kWatch,       // a: node (the next event of its key reaches its cell brain's watch)
    kPgUp,        // PostgreSQL can be reached again
};

struct Ev {
    int64_t t;
    uint64_t seq;
    Kind kind;
    uint32_t a, b;
    int64_t c;
};

//! The pending events: a wheel of one slot per millisecond for the next ~17 minutes, and a map
//! for later ones. Each slot is a list through one pool of events, so scheduling allocates
//! nothing once the pool has grown. Events of one millisecond come out in the order they were
//! scheduled. (A heap of a million sessions' next events cost more than the brains themselves.)
class Calendar {
  public:
    Calendar() : head_(kSpan, kNil), tail_(kSpan, kNil) {}
    void push(const Ev & e) {
        if (e.t >= now_ + int64_t(kSpan)) {
            far_[e.t].push_back(e);
            return;
        }
        uint32_t i;
        if (free_ != kNil) {
            i = free_;
            free_ = next_of_[i];
            pool_[i] = e;
        } else {
            i = uint32_t(pool_.size());
            pool_.push_back(e);
            next_of_.push_back(kNil);
        }
        next_of_[i] = kNil;
        const size_t slot = size_t(std::max(e.t, now_)) % kSpan;
        if (tail_[slot] == kNil)
            head_[slot] = i;
        else
            next_of_[tail_[slot]] = i;
        tail_[slot] = i;
    }
    //! The next event at or before `end`; false when there is none.
    bool pop(Ev & out, int64_t end) {
        for (;;) {
            const size_t slot = size_t(now_) % kSpan;
            if (const uint32_t i = head_[slot]; i != kNil) {
                out = pool_[i];
                head_[slot] = next_of_[i];
                if (head_[slot] == kNil) tail_[slot] = kNil;
                next_of_[i] = free_;
                free_ = i;
                return true;
            }
            if (now_ >= end) return false;
            ++now_;
            // Later events enter the wheel as their millisecond comes within its span.
            while (!far_.empty() && far_.begin()->first < now_ + int64_t(kSpan)) {
                auto later = std::move(far_.begin()->second);
                far_.erase(far_.begin());
                for (const Ev & e : later)
                    push(e);
            }
        }
    }

  private:
    static constexpr size_t kSpan = size_t(1) << 20;
    static constexpr uint32_t kNil = ~uint32_t(0);
    std::vector<Ev> pool_;
    std::vector<uint32_t> next_of_, head_, tail_;
    uint32_t free_ = kNil;
    std::map<int64_t, std::vector<Ev>> far_;
    int64_t now_ = 0;
};

}  // namespace armada::sim::detail

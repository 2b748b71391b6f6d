#pragma once

// What a gateway counts, for its /metrics: requests and answers, refusals by why, and where
// generations went. Each unit counts its own here; `Gateway::render_metrics` shows them.
//
// Owns: the counts only. Thread-safe; it includes nothing of the gateway's other units.

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace armada::gateway {

class GatewayCounters {
  public:
    using Pairs = std::map<std::pair<std::string, std::string>, uint64_t>;

    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> route_hits{0};       // session reads routed from the Redis route cache
    std::atomic<uint64_t> refused_full{0};     // new sessions refused: every cell at its water level
    std::atomic<uint64_t> refused_streams{0};  // event streams over a tenant's cap
    std::atomic<uint64_t> refused_workers{0};  // requests refused: every worker busy

    //! An answer's status, by class (the request handler's tap).
    void answered(int status) {
        if (status >= 100 && status < 600) ++answers_[size_t(status / 100)];
    }
    uint64_t answers(size_t cls) const { return answers_[cls].load(); }
    void quota_refused(const std::string & quota) {
        std::lock_guard lk(mu_);
        refused_[quota]++;
    }
    //! A generation sent to `target` (cpu or a pool) by `rule`.
    void routed(const std::string & target, const std::string & rule) {
        std::lock_guard lk(mu_);
        ++routed_[{target, rule}];
    }
    //! A generation a rule sent to `pool` that went to the CPU nodes, by why.
    void fell_back(const std::string & pool, const std::string & reason) {
        std::lock_guard lk(mu_);
        ++fallbacks_[{pool, reason}];
    }
    std::map<std::string, uint64_t> quota_refusals() const {
        std::lock_guard lk(mu_);
        return refused_;
    }
    Pairs routes() const {
        std::lock_guard lk(mu_);
        return routed_;
    }
    Pairs fallbacks() const {
        std::lock_guard lk(mu_);
        return fallbacks_;
    }

  private:
    std::array<std::atomic<uint64_t>, 6> answers_{};  // by status class: [5] counts 5xx
    mutable std::mutex mu_;
    std::map<std::string, uint64_t> refused_;  // quota → 429s; mu_
    Pairs routed_;                             // (route, rule) → requests; mu_
    Pairs fallbacks_;                          // (pool, reason) → requests; mu_
};

}  // namespace armada::gateway

#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace armada::api {

//! Limits of one API key. Zero means unlimited.
struct RateLimits {
    double requests_per_min = 0;
    double tokens_per_min = 0;
    bool any() const { return requests_per_min > 0 || tokens_per_min > 0; }
};

//! Per-key token buckets, one for requests and one for model tokens.
//!
//! A request takes one unit from the request bucket when it is admitted. Tokens (prompt plus
//! generated) are only known once the engine is done, so they are charged afterwards and may
//! take the bucket below zero; the key is then refused until the debt has refilled. Both
//! buckets start full and refill continuously at their per-minute rate.
class RateLimiter {
  public:
    //! Monotonic milliseconds; tests pass a fake.
    using Now = std::function<int64_t()>;

    explicit RateLimiter(RateLimits defaults = {}, Now now = {});

    //! Overrides the defaults for one account (the hashed key).
    void set_limits(const std::string & account, RateLimits limits);
    //! True when any account has a limit.
    bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

    struct Decision {
        bool ok = true;
        const char * which = "";  // "requests" or "tokens" when refused
        double limit = 0;         // per minute, of the bucket that refused
        double retry_after_s = 0;
    };
    //! Admits one request of `account`, taking one unit, or says why and for how long not.
    Decision admit(const std::string & account);
    //! Charges model tokens to `account` after the work is done.
    void charge(const std::string & account, int64_t tokens);

    //! Current level of the tokens bucket (for tests and metrics).
    double tokens_left(const std::string & account);

  private:
    struct Bucket {
        double level = 0;
        int64_t at_ms = 0;
        void refill(double per_min, int64_t now_ms);
    };
    struct Account {
        RateLimits limits;
        Bucket requests, tokens;
        bool started = false;
    };
    Account & account(const std::string & name, int64_t now_ms);

    RateLimits defaults_;
    Now now_;
    std::atomic<bool> enabled_{false};
    std::mutex mu_;
    std::unordered_map<std::string, RateLimits> overrides_;
    std::unordered_map<std::string, Account> accounts_;  // bounded by the configured keys
};

}  // namespace armada::api

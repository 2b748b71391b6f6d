#include "api/rate_limit.h"

#include "common/clock.h"

#include <algorithm>
#include <cmath>

namespace armada::api {

RateLimiter::RateLimiter(RateLimits defaults, Now now)
    : defaults_(defaults), now_(now ? std::move(now) : Now(common::steady_ms)), enabled_(defaults.any()) {}

void RateLimiter::set_limits(const std::string & account, RateLimits limits) {
    std::lock_guard lk(mu_);
    overrides_[account] = limits;
    accounts_.erase(account);
    if (limits.any()) enabled_ = true;
}

void RateLimiter::Bucket::refill(double per_min, int64_t now_ms) {
    if (per_min <= 0) return;
    const double elapsed_min = double(std::max<int64_t>(0, now_ms - at_ms)) / 60000.0;
    level = std::min(per_min, level + elapsed_min * per_min);
    at_ms = now_ms;
}

RateLimiter::Account & RateLimiter::account(const std::string & name, int64_t now_ms) {
    Account & a = accounts_[name];
    if (!a.started) {
        auto it = overrides_.find(name);
        a.limits = it == overrides_.end() ? defaults_ : it->second;
        a.requests = {a.limits.requests_per_min, now_ms};
        a.tokens = {a.limits.tokens_per_min, now_ms};
        a.started = true;
    }
    a.requests.refill(a.limits.requests_per_min, now_ms);
    a.tokens.refill(a.limits.tokens_per_min, now_ms);
    return a;
}

RateLimiter::Decision RateLimiter::admit(const std::string & name) {
    if (!enabled()) return {};
    const int64_t now = now_();
    std::lock_guard lk(mu_);
    Account & a = account(name, now);
    Decision d;
    // Seconds until a bucket holds `need`, at `per_min`.
    auto wait_s = [](double level, double need, double per_min) { return (need - level) * 60.0 / per_min; };
    if (a.limits.requests_per_min > 0 && a.requests.level < 1.0) {
        d = {false, "requests", a.limits.requests_per_min, wait_s(a.requests.level, 1.0, a.limits.requests_per_min)};
    } else if (a.limits.tokens_per_min > 0 && a.tokens.level <= 0.0) {
        // In debt: wait until the bucket is back above zero.
        d = {false, "tokens", a.limits.tokens_per_min, wait_s(a.tokens.level, 1.0, a.limits.tokens_per_min)};
    }
    if (!d.ok) {
        d.retry_after_s = std::max(1.0, std::ceil(d.retry_after_s));
        return d;
    }
    if (a.limits.requests_per_min > 0) a.requests.level -= 1.0;
    return d;
}

void RateLimiter::charge(const std::string & name, int64_t tokens) {
    if (!enabled() || tokens <= 0) return;
    const int64_t now = now_();
    std::lock_guard lk(mu_);
    Account & a = account(name, now);
    if (a.limits.tokens_per_min > 0) a.tokens.level -= double(tokens);
}

double RateLimiter::tokens_left(const std::string & name) {
    const int64_t now = now_();
    std::lock_guard lk(mu_);
    return account(name, now).tokens.level;
}

}  // namespace armada::api

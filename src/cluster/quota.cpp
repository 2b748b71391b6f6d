#include "cluster/quota.h"

#include "common/clock.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

namespace armada::cluster {

namespace {

constexpr int64_t kWindowS = 60;

// KEYS[1]: the window (second → amount). ARGV: now_s, limit, cost.
// Returns {admitted, used before, retry after s}. Same rule as LocalWindow::admit.
constexpr const char * kWindowScript = R"lua(
local now = tonumber(ARGV[1]); local limit = tonumber(ARGV[2]); local cost = tonumber(ARGV[3])
local used = 0; local oldest = now
local f = redis.call('HGETALL', KEYS[1])
for i = 1, #f, 2 do
  local s = tonumber(f[i])
  if s <= now - 60 then
    redis.call('HDEL', KEYS[1], f[i])
  else
    used = used + tonumber(f[i + 1])
    if s < oldest then oldest = s end
  end
end
if used > 0 and (used >= limit or used + cost > limit) then
  return {0, used, math.max(1, oldest + 60 - now)}
end
redis.call('HINCRBY', KEYS[1], tostring(now), cost)
redis.call('EXPIRE', KEYS[1], 120)
return {1, used, 0}
)lua";

// KEYS[1]: the window. ARGV: second, delta, now_s. Settles only a second still in the window.
constexpr const char * kSettleScript = R"lua(
if tonumber(ARGV[1]) > tonumber(ARGV[3]) - 60 and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
end
return {1}
)lua";

// KEYS[1]: the live set (session id → admitted ms). ARGV: id, limit, now_ms.
// Returns {admitted, size before}.
constexpr const char * kLiveScript = R"lua(
local n = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {1, n} end
if n >= tonumber(ARGV[2]) then return {0, n} end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return {1, n}
)lua";

// KEYS[1]: the live set. ARGV: cutoff_ms, then the ids the store says are open. Members admitted
// before the cutoff that are not open leave; open ids missing from the set join it.
constexpr const char * kRepairScript = R"lua(
local keep = {}
for i = 2, #ARGV do keep[ARGV[i]] = true end
local removed = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do
  if not keep[id] then redis.call('ZREM', KEYS[1], id); removed = removed + 1 end
end
for i = 2, #ARGV do
  if not redis.call('ZSCORE', KEYS[1], ARGV[i]) then redis.call('ZADD', KEYS[1], ARGV[1], ARGV[i]) end
end
return {removed, redis.call('ZCARD', KEYS[1])}
)lua";

// KEYS[1]: the window. ARGV: now_s, amount. Charges without admitting (work already done).
constexpr const char * kChargeScript = R"lua(
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], 120)
return {1}
)lua";

}  // namespace

TokenCharger::TokenCharger(RedisPool & redis) : redis_(redis) {
    thread_ = std::thread([this] {
        std::unique_lock lk(mu_);
        while (!stop_) {
            cv_.wait_for(lk, std::chrono::milliseconds(250));
            lk.unlock();
            flush();
            lk.lock();
        }
    });
}

TokenCharger::~TokenCharger() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
    flush();
}

void TokenCharger::add(const std::string & tenant, int64_t tokens) {
    if (tokens <= 0) return;
    std::lock_guard lk(mu_);
    pending_[tenant] += tokens;
}

void TokenCharger::flush() {
    std::map<std::string, int64_t> batch;
    {
        std::lock_guard lk(mu_);
        batch.swap(pending_);
    }
    const int64_t now = common::unix_s();
    for (const auto & [tenant, n] : batch)
        redis_.eval(kChargeScript, {Quotas::window_key(tenant, "tokens_per_minute")},
                    {std::to_string(now), std::to_string(n)});
}

LocalWindow::Decision LocalWindow::admit(const std::string & key, int64_t limit, int64_t cost, int64_t now_s) {
    std::lock_guard lk(mu_);
    auto & w = windows_[key];
    w.erase(w.begin(), w.upper_bound(now_s - kWindowS));
    Decision d;
    for (const auto & [s, n] : w)
        d.used += n;
    if (d.used > 0 && (d.used >= limit || d.used + cost > limit)) {
        d.ok = false;
        d.retry_after_s = int(std::max<int64_t>(1, w.begin()->first + kWindowS - now_s));
        return d;
    }
    w[now_s] += cost;
    return d;
}

void LocalWindow::settle(const std::string & key, int64_t at_s, int64_t delta, int64_t now_s) {
    std::lock_guard lk(mu_);
    auto it = windows_.find(key);
    if (it == windows_.end() || at_s <= now_s - kWindowS) return;
    auto s = it->second.find(at_s);
    if (s != it->second.end()) s->second += delta;
}

Quotas::Quotas(RedisPool * redis, std::function<int()> gateways) : redis_(redis), gateways_(std::move(gateways)) {}

std::string Quotas::window_key(const std::string & tenant, const std::string & quota) {
    return "armada:t:" + tenant + ":quota:" + quota;
}

std::string Quotas::live_key(const std::string & tenant) {
    return "armada:t:" + tenant + ":quota:live_sessions";
}

int64_t Quotas::wall_ms() {
    return common::wall_ms();
}

int64_t Quotas::wall_s() {
    return wall_ms() / 1000;
}

void Quotas::note_redis(bool reachable) {
    const bool was_local = local_.exchange(!reachable);
    if (was_local == !reachable) return;
    if (reachable)
        spdlog::info("quotas: Redis answers again; tenant quotas are shared by every gateway again");
    else
        spdlog::warn(
            "quotas: Redis cannot be reached; each gateway now enforces its share of every tenant quota "
            "alone (the quota divided by the {} live gateway(s))",
            std::max(1, gateways_()));
}

void Quotas::redis_failed() {
    if (!redis_ || !redis_->reachable()) note_redis(false);
}

std::optional<QuotaRefusal> Quotas::window(const std::string & tenant, const std::string & quota, int64_t limit,
                                           int64_t cost, int64_t now_s, bool & local) {
    const std::string key = window_key(tenant, quota);
    local = false;
    if (redis_) {
        auto r =
            redis_->eval(kWindowScript, {key}, {std::to_string(now_s), std::to_string(limit), std::to_string(cost)});
        if (r && r->size() == 3) {
            note_redis(true);
            if ((*r)[0] == 1) return std::nullopt;
            return QuotaRefusal{quota, limit, int((*r)[2]), false};
        }
    }
    redis_failed();
    local = true;
    ++local_decisions_;
    // This gateway's share; never below one request (or token) a minute, so never all refused.
    const int64_t share = std::max<int64_t>(1, limit / std::max(1, gateways_()));
    auto d = local_window_.admit(key, share, cost, now_s);
    if (d.ok) return std::nullopt;
    return QuotaRefusal{quota, limit, d.retry_after_s, true};
}

std::optional<QuotaRefusal> Quotas::request(const std::string & tenant, int64_t rpm) {
    if (rpm <= 0) return std::nullopt;
    bool local = false;
    return window(tenant, "requests_per_minute", rpm, 1, wall_s(), local);
}

std::optional<QuotaRefusal> Quotas::reserve_tokens(const std::string & tenant, int64_t tpm, int64_t estimate,
                                                   TokenHold & hold) {
    hold.at_s = wall_s();
    hold.estimate = std::max<int64_t>(1, estimate);
    if (tpm <= 0) return std::nullopt;
    return window(tenant, "tokens_per_minute", tpm, hold.estimate, hold.at_s, hold.local);
}

void Quotas::settle_tokens(const std::string & tenant, const TokenHold & hold, int64_t actual) {
    const int64_t delta = std::max<int64_t>(0, actual) - hold.estimate;
    if (delta == 0) return;
    const std::string key = window_key(tenant, "tokens_per_minute");
    const int64_t now = wall_s();
    // Settled where it was reserved (a Redis that went away since loses the correction).
    if (hold.local)
        local_window_.settle(key, hold.at_s, delta, now);
    else if (redis_)
        redis_->eval(kSettleScript, {key}, {std::to_string(hold.at_s), std::to_string(delta), std::to_string(now)});
}

std::optional<QuotaRefusal> Quotas::live_session(
    const std::string & tenant, const std::string & id, int64_t limit,
    const std::function<std::optional<std::vector<std::string>>()> & open_ids) {
    if (limit <= 0) return std::nullopt;
    const std::string key = live_key(tenant);
    for (int attempt = 0; attempt < 2 && redis_; ++attempt) {
        auto r = redis_->eval(kLiveScript, {key}, {id, std::to_string(limit), std::to_string(wall_ms())});
        if (!r || r->size() != 2) break;
        note_redis(true);
        if ((*r)[0] == 1) return std::nullopt;
        // Full. The sessions that ended since are still in the set: the store says which.
        bool repair = attempt == 0;
        if (repair) {
            std::lock_guard lk(mu_);
            int64_t & last = repaired_ms_[tenant];
            repair = wall_ms() - last >= 1000;  // at most once a second per tenant
            if (repair) last = wall_ms();
        }
        auto open = repair ? open_ids() : std::nullopt;
        if (!open) return QuotaRefusal{"live_sessions", limit, 5, false};
        std::vector<std::string> args = {std::to_string(wall_ms() - repair_grace_ms_)};
        args.insert(args.end(), open->begin(), open->end());
        if (!redis_->eval(kRepairScript, {key}, args)) break;
    }
    // Redis failed: the store's count is every gateway's, so the whole quota applies (two
    // gateways admitting at the same moment may pass it by one each).
    redis_failed();
    ++local_decisions_;
    auto open = open_ids();
    if (!open || int64_t(open->size()) < limit) return std::nullopt;
    return QuotaRefusal{"live_sessions", limit, 5, true};
}

void Quotas::forget_session(const std::string & tenant, const std::string & id) {
    if (redis_) redis_->eval("redis.call('ZREM', KEYS[1], ARGV[1]) return {1}", {live_key(tenant)}, {id});
}

}  // namespace armada::cluster

#pragma once

#include "cluster/redis.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace armada::cluster {

//! Requests or tokens counted per second over the last 60 seconds, in this process: the
//! gateways' fallback when Redis cannot be reached. Pure; time comes in.
class LocalWindow {
  public:
    struct Decision {
        bool ok = true;
        int64_t used = 0;       // in the window before this request
        int retry_after_s = 0;  // when refused: until enough has left the window
    };
    //! Admits `cost` under `limit` per minute at second `now_s`. A request is admitted while the
    //! window holds less than the limit and `cost` fits, or the window is empty (so one request
    //! larger than the whole quota is not refused for ever).
    Decision admit(const std::string & key, int64_t limit, int64_t cost, int64_t now_s);
    //! Adds `delta` (may be negative) to what second `at_s` charged, if it is still in the window.
    void settle(const std::string & key, int64_t at_s, int64_t delta, int64_t now_s);

  private:
    std::mutex mu_;
    std::map<std::string, std::map<int64_t, int64_t>> windows_;  // key → second → amount; mu_
};

//! Charges the model tokens of agent sessions on a node to their tenants' tokens-per-minute
//! windows in Redis, so the gateways count them too (sessions already running go on; a tenant
//! over its quota gets no new work). Callers only add to a map; a thread of its own sends it
//! every 250 ms, one script per tenant, and drops what Redis does not take.
class TokenCharger {
  public:
    explicit TokenCharger(RedisPool & redis);
    ~TokenCharger();
    TokenCharger(const TokenCharger &) = delete;
    void add(const std::string & tenant, int64_t tokens);

  private:
    void flush();
    RedisPool & redis_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, int64_t> pending_;  // tenant → tokens; mu_
    bool stop_ = false;                       // mu_
    std::thread thread_;
};

//! A tenant's quotas, as its record in PostgreSQL sets them; 0 is unlimited.
struct TenantQuota {
    int64_t rpm = 0, tpm = 0, live_sessions = 0, kv_bytes = 0;
};

//! Why a request was refused: the quota it would exceed, for a 429 with Retry-After.
struct QuotaRefusal {
    std::string quota;  // "requests_per_minute", "tokens_per_minute", "live_sessions", "kv_bytes"
    int64_t limit = 0;
    int retry_after_s = 1;
    bool local = false;  // decided by this gateway alone (Redis unreachable)
};

//! Tenant quotas enforced by every gateway together through Redis. Requests and tokens use a
//! sliding window of 60 one-second buckets (one hash per tenant and quota); live sessions are a
//! sorted set of session ids per tenant. Tokens are reserved at admission and settled when the
//! request ends. When Redis cannot be reached, each gateway enforces `limit / live gateways`
//! alone (LocalWindow), logs the change both ways and counts the decisions it made so.
class Quotas {
  public:
    //! `redis` may be null (no Redis configured: always per gateway). `gateways` says how many
    //! gateways are live (at least 1).
    Quotas(RedisPool * redis, std::function<int()> gateways);

    //! One request; refused with the quota's name, or admitted.
    std::optional<QuotaRefusal> request(const std::string & tenant, int64_t rpm);
    //! Where a reservation of tokens was made, to settle it there.
    struct TokenHold {
        int64_t at_s = 0;
        int64_t estimate = 0;
        bool local = false;  // in this gateway's window (Redis was not used)
    };
    //! Reserves `estimate` tokens, filling `hold`.
    std::optional<QuotaRefusal> reserve_tokens(const std::string & tenant, int64_t tpm, int64_t estimate,
                                               TokenHold & hold);
    //! The request that made `hold` used `actual` tokens.
    void settle_tokens(const std::string & tenant, const TokenHold & hold, int64_t actual);
    //! Admits session `id` as live. When the set is full, `open_ids` (the tenant's sessions not
    //! ended, from the store) repairs it once, at most every second per tenant, and admission is
    //! tried again: sessions that ended leave it that way.
    std::optional<QuotaRefusal> live_session(const std::string & tenant, const std::string & id, int64_t limit,
                                             const std::function<std::optional<std::vector<std::string>>()> & open_ids);
    //! How long a repair leaves an admitted session that the store does not show yet (it may be
    //! being written).
    void set_repair_grace_ms(int64_t ms) { repair_grace_ms_ = ms; }
    //! A session admitted but never stored leaves the set.
    void forget_session(const std::string & tenant, const std::string & id);

    //! True while decisions are made per gateway.
    bool local() const { return local_.load(); }
    uint64_t local_decisions() const { return local_decisions_.load(); }

    //! The Redis keys (they carry the tenant).
    static std::string window_key(const std::string & tenant, const std::string & quota);
    static std::string live_key(const std::string & tenant);

  private:
    //! `local` says whether this gateway decided alone.
    std::optional<QuotaRefusal> window(const std::string & tenant, const std::string & quota, int64_t limit,
                                       int64_t cost, int64_t now_s, bool & local);
    //! After a Redis call failed: switches to per-gateway mode if Redis is down (not when it
    //! answered but the call failed, e.g. every pooled connection was busy).
    void redis_failed();
    void note_redis(bool reachable);
    static int64_t wall_s();
    static int64_t wall_ms();

    RedisPool * redis_;
    std::function<int()> gateways_;
    LocalWindow local_window_;
    std::atomic<bool> local_{false};
    std::atomic<uint64_t> local_decisions_{0};
    int64_t repair_grace_ms_ = 10000;
    std::mutex mu_;
    std::map<std::string, int64_t> repaired_ms_;  // tenant → last repair of its live set; mu_
};

}  // namespace armada::cluster

#pragma once

#include "cluster/service_auth.h"
#include "store/store.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

struct redisContext;

namespace armada::cluster {

//! A fixed pool of connections to Redis (hiredis), opened and checked (PING) at start. Redis
//! holds only what can be rebuilt (routes, affinity, quota counters): every call that fails
//! returns nullopt or false and the caller goes on without it, so a Redis restart costs no
//! client an error. A broken connection is reopened once per call, after which the call fails.
//! Keys are built by the callers and always carry the tenant and, for a session, its id.
class RedisPool {
  public:
    //! `addr` is host:port. Opens `size` connections; an error if the first cannot be opened.
    //! With a user and password in `auth` each connection authenticates first (AUTH, an ACL
    //! user); with a CA or a certificate there, it speaks TLS.
    static std::unique_ptr<RedisPool> open(const std::string & addr, int size, int timeout_ms, std::string & error,
                                           const ServiceCredentials & auth = {});
    ~RedisPool();
    RedisPool(const RedisPool &) = delete;

    //! The value, or nullopt; with `renew_ttl_ms`, the key's TTL starts again (GETEX) when it is
    //! there.
    std::optional<std::string> get(const std::string & key, int64_t renew_ttl_ms = 0);
    bool set(const std::string & key, const std::string & value, int64_t ttl_ms);
    bool del(const std::string & key);
    //! INCR, and an expiry when the key is new; the new value, or nullopt.
    std::optional<int64_t> incr(const std::string & key, int64_t ttl_ms);
    //! EVAL of a Lua script whose reply is an array of integers; nullopt when Redis cannot be
    //! reached or the script fails.
    std::optional<std::vector<int64_t>> eval(const std::string & script, const std::vector<std::string> & keys,
                                             const std::vector<std::string> & args);
    //! False after a call found no Redis (for a second at least).
    bool reachable() const;
    //! Waits for connections, as the store's pools report them (armada_redis_pool_* metrics).
    store::PoolStats stats() const;

  private:
    RedisPool() = default;
    std::string user_, password_;
    std::shared_ptr<boost::asio::ssl::context> tls_;  // null: plain TCP
    struct Conn;
    //! Runs `argv` on a pooled connection; the reply's type and text/integer.
    struct Reply {
        bool ok = false;
        bool nil = false;
        std::string str;
        int64_t integer = 0;
        std::vector<int64_t> ints;  // an array reply's integers
    };
    //! `resend`: send it again on a new connection if the first one broke (only for commands
    //! that are safe to run twice).
    Reply command(const std::vector<std::string> & argv, bool resend = true);
    redisContext * connect(std::string & error) const;
    //! How long calls skip Redis after one found it away: about a second, jittered.
    static std::chrono::milliseconds down_pause();

    std::string host_;
    int port_ = 0;
    int timeout_ms_ = 1000;
    int wait_ms_ = 2000;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<redisContext *> free_;  // guarded by mu_
    size_t size_ = 0;
    uint64_t acquired_ = 0, waited_ = 0, wait_us_ = 0, timeouts_ = 0, reconnects_ = 0;  // mu_
    size_t in_use_ = 0;                                                                 // mu_
    bool last_ok_ = true;                                                               // mu_
    std::chrono::steady_clock::time_point down_until_{};                                // mu_
};

}  // namespace armada::cluster

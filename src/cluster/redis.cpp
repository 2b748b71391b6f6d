#include "cluster/redis.h"
#include "common/backoff.h"

#include "cluster/cluster_config.h"
#include "cluster/tls_relay.h"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>

namespace armada::cluster {

std::unique_ptr<RedisPool> RedisPool::open(const std::string & addr, int size, int timeout_ms, std::string & error,
                                           const ServiceCredentials & auth) {
    std::unique_ptr<RedisPool> p(new RedisPool());
    p->user_ = auth.user;
    p->password_ = auth.password;
    if (auth.tls() && !(p->tls_ = service_tls(auth, "redis", error))) return nullptr;
    const size_t colon = addr.rfind(':');
    if (colon == std::string::npos || colon == 0) {
        error = "redis address '" + addr + "' is not host:port";
        return nullptr;
    }
    p->host_ = addr.substr(0, colon);
    try {
        p->port_ = std::stoi(addr.substr(colon + 1));
    } catch (const std::exception &) {
        error = "redis address '" + addr + "' is not host:port";
        return nullptr;
    }
    p->timeout_ms_ = timeout_ms;
    for (int i = 0; i < std::max(1, size); ++i) {
        redisContext * c = p->connect(error);
        if (!c) return nullptr;
        // Checked at start: a pool that cannot answer PING is an error now, not under load.
        auto * r = static_cast<redisReply *>(redisCommand(c, "PING"));
        const bool ok = r && r->type == REDIS_REPLY_STATUS;
        const std::string said = r && r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : std::string();
        if (r) freeReplyObject(r);
        if (!ok) {
            error = "redis at " + addr + " did not answer PING" + (said.empty() ? "" : ": " + said);
            redisFree(c);
            return nullptr;
        }
        p->free_.push_back(c);
    }
    p->size_ = p->free_.size();
    return p;
}

RedisPool::~RedisPool() {
    for (auto * c : free_) {
        if (c) redisFree(c);
    }
}

redisContext * RedisPool::connect(std::string & error) const {
    timeval tv{timeout_ms_ / 1000, (timeout_ms_ % 1000) * 1000};
    redisContext * c = nullptr;
    if (tls_) {
        // hiredis 0.14 speaks plain TCP: it gets a socket relayed through TLS.
        std::string why;
        const int fd = open_tls_relay(host_, port_, tls_, timeout_ms_, why);
        if (fd < 0) {
            error = "redis at " + host_ + ":" + std::to_string(port_) + " (TLS): " + why;
            return nullptr;
        }
        c = redisConnectFd(fd);
        if (!c) ::close(fd);
    } else {
        c = redisConnectWithTimeout(host_.c_str(), port_, tv);
    }
    if (!c || c->err) {
        error = "redis at " + host_ + ":" + std::to_string(port_) + ": " + (c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return nullptr;
    }
    redisSetTimeout(c, tv);
    if (!password_.empty()) {
        // An ACL user (AUTH user password), or the default user's password alone.
        auto * r =
            static_cast<redisReply *>(user_.empty() ? redisCommand(c, "AUTH %b", password_.data(), password_.size())
                                                    : redisCommand(c, "AUTH %b %b", user_.data(), user_.size(),
                                                                   password_.data(), password_.size()));
        const bool ok = r && r->type == REDIS_REPLY_STATUS;
        // Never the password: the error names the user only.
        const std::string said = r && r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "no answer";
        if (r) freeReplyObject(r);
        if (!ok) {
            error = "redis at " + host_ + ":" + std::to_string(port_) + " refused user '" + user_ + "': " + said;
            redisFree(c);
            return nullptr;
        }
    }
    return c;
}

RedisPool::Reply RedisPool::command(const std::vector<std::string> & argv, bool resend) {
    redisContext * c = nullptr;
    const auto now = std::chrono::steady_clock::now();
    {
        std::unique_lock lk(mu_);
        // Redis was unreachable a moment ago: skip it for a second instead of every request
        // waiting for a connect to fail.
        if (now < down_until_) return {};
        ++acquired_;
        if (free_.empty()) {
            ++waited_;
            const auto t0 = std::chrono::steady_clock::now();
            const bool got = cv_.wait_for(lk, std::chrono::milliseconds(wait_ms_), [&] { return !free_.empty(); });
            wait_us_ += uint64_t(
                std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
            if (!got) {
                ++timeouts_;
                return {};
            }
        }
        c = free_.back();
        free_.pop_back();
        ++in_use_;
    }
    std::vector<const char *> args;
    std::vector<size_t> lens;
    for (const auto & a : argv) {
        args.push_back(a.data());
        lens.push_back(a.size());
    }
    Reply out;
    bool answered = false;
    for (int attempt = 0; attempt < (resend ? 2 : 1); ++attempt) {
        if (!c || c->err) {
            // The server went away (a restart): one new connection per call, no waiting loop.
            if (c) redisFree(c);
            std::string e;
            c = connect(e);
            std::lock_guard lk(mu_);
            ++reconnects_;
            if (!c) {
                down_until_ = std::chrono::steady_clock::now() + down_pause();
                break;
            }
        }
        auto * r = static_cast<redisReply *>(redisCommandArgv(c, int(args.size()), args.data(), lens.data()));
        if (!r) continue;  // c->err is set: reconnect and try once more
        answered = true;
        out.ok = r->type != REDIS_REPLY_ERROR;
        out.nil = r->type == REDIS_REPLY_NIL;
        if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR)
            out.str.assign(r->str, r->len);
        if (r->type == REDIS_REPLY_INTEGER) out.integer = r->integer;
        if (r->type == REDIS_REPLY_ARRAY) {
            for (size_t i = 0; i < r->elements; ++i)
                out.ints.push_back(r->element[i]->type == REDIS_REPLY_INTEGER ? r->element[i]->integer : 0);
        }
        freeReplyObject(r);
        break;
    }
    {
        std::lock_guard lk(mu_);
        --in_use_;
        free_.push_back(c);  // null: the slot's next user connects again
        // No answer (refused, or a server that accepts but does not reply): the next calls
        // skip Redis for about a second instead of each waiting out its timeout.
        if (!answered) down_until_ = std::chrono::steady_clock::now() + down_pause();
        last_ok_ = answered;
    }
    cv_.notify_one();
    return out;
}

std::chrono::milliseconds RedisPool::down_pause() {
    return std::chrono::milliseconds(common::jittered_ms(1000));
}

std::optional<std::string> RedisPool::get(const std::string & key, int64_t renew_ttl_ms) {
    auto r = renew_ttl_ms > 0 ? command({"GETEX", key, "PX", std::to_string(renew_ttl_ms)}) : command({"GET", key});
    if (!r.ok || r.nil) return std::nullopt;
    return r.str;
}

bool RedisPool::set(const std::string & key, const std::string & value, int64_t ttl_ms) {
    return command({"SET", key, value, "PX", std::to_string(std::max<int64_t>(1, ttl_ms))}).ok;
}

bool RedisPool::del(const std::string & key) {
    return command({"DEL", key}).ok;
}

std::optional<int64_t> RedisPool::incr(const std::string & key, int64_t ttl_ms) {
    auto r = command({"INCR", key});
    if (!r.ok) return std::nullopt;
    if (r.integer == 1) command({"PEXPIRE", key, std::to_string(ttl_ms)});
    return r.integer;
}

std::optional<std::vector<int64_t>> RedisPool::eval(const std::string & script, const std::vector<std::string> & keys,
                                                    const std::vector<std::string> & args) {
    std::vector<std::string> argv = {"EVAL", script, std::to_string(keys.size())};
    argv.insert(argv.end(), keys.begin(), keys.end());
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = command(argv, false);  // a script sent once may have run: never sent twice
    if (!r.ok) {
        if (!r.str.empty()) spdlog::warn("redis: script failed: {}", r.str);
        return std::nullopt;
    }
    return r.ints;
}

bool RedisPool::reachable() const {
    std::lock_guard lk(mu_);
    return last_ok_ && std::chrono::steady_clock::now() >= down_until_;
}

store::PoolStats RedisPool::stats() const {
    std::lock_guard lk(mu_);
    store::PoolStats s;
    s.size = size_;
    s.in_use = in_use_;
    s.acquired = acquired_;
    s.waited = waited_;
    s.wait_us = wait_us_;
    s.timeouts = timeouts_;
    s.reconnects = reconnects_;
    return s;
}

}  // namespace armada::cluster

#include "cluster/runtime/election.h"

#include <algorithm>
#include <cstdio>

namespace armada::cluster {

std::string election_key(const std::string & election, int64_t lease) {
    char hex[24];
    std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(lease));
    return election + "/" + hex;
}

std::optional<EtcdLeader> oldest_candidate(const std::string & election, const std::vector<EtcdKv> & candidates) {
    const EtcdKv * first = nullptr;
    for (const auto & k : candidates)
        if (!first || k.create_revision < first->create_revision) first = &k;
    if (!first) return std::nullopt;
    return EtcdLeader{election, first->key, first->value, first->create_revision, first->lease};
}

std::string stand(KvStore & kv, const std::string & election, const std::string & value, int64_t lease,
                  EtcdLeader & me) {
    if (lease == 0) return "a candidacy needs a lease";  // a key without one would outlive its process
    const std::string key = election_key(election, lease);
    if (auto e = kv.put(key, value, lease); !e.empty()) return e;
    std::optional<EtcdKv> got;
    if (auto e = kv.get(key, got); !e.empty()) return e;
    if (!got || got->lease != lease) return "the candidacy went as it was made (its lease ended)";
    me = {election, key, value, got->create_revision, lease};
    return {};
}

std::string election_leader(KvStore & kv, const std::string & election, EtcdLeader & out) {
    std::vector<EtcdKv> kvs;
    int64_t revision = 0;
    if (auto e = kv.list(election + "/", kvs, revision); !e.empty()) return e;
    auto l = oldest_candidate(election, kvs);
    if (!l) return "no leader";
    out = *l;
    return {};
}

std::string resign(KvStore & kv, const EtcdLeader & me) {
    // Only the candidacy `me` made: a key of that name made again since (a restore, then a new
    // stand under the same lease) is not this term's to delete.
    bool erased = false;
    return kv.erase_if_created(me.key, me.rev, erased);
}

bool ElectionView::refresh(int wait_ms, std::string & error) {
    if (!watch_) {
        std::vector<EtcdKv> kvs;
        int64_t revision = 0;
        if (auto e = kv_.list(election_ + "/", kvs, revision); !e.empty()) {
            up_ = false;
            error = std::move(e);
            return false;
        }
        keys_.clear();
        for (auto & k : kvs)
            keys_[k.key] = std::move(k);
        watch_ = kv_.watch(election_ + "/", revision + 1);
        up_ = true;
    } else {
        std::vector<EtcdEvent> events;
        if (!watch_->take(events, wait_ms, error)) {
            watch_.reset();  // list again next time
            up_ = false;
            return false;
        }
        for (auto & ev : events) {
            if (ev.type == EtcdEvent::Type::Put)
                keys_[ev.kv.key] = std::move(ev.kv);
            else
                keys_.erase(ev.kv.key);
        }
    }
    std::vector<EtcdKv> kvs;
    kvs.reserve(keys_.size());
    for (const auto & [key, kv] : keys_)
        kvs.push_back(kv);
    oldest_ = oldest_candidate(election_, kvs);
    return true;
}

int64_t renew_every_ms(int64_t ttl_ms) {
    return std::max<int64_t>(300, ttl_ms / 3);
}

int64_t stall_limit_of(int64_t ttl_ms) {
    // Checked every renewal at the latest, the lease is given up at most one TTL after the last beat.
    return std::max<int64_t>(1, ttl_ms - renew_every_ms(ttl_ms));
}

LeaseStep lease_step(int64_t now_ms, int64_t renewed_ms, int64_t beat_ms, bool leading, int64_t ttl_ms) {
    if (now_ms - renewed_ms >= ttl_ms) return LeaseStep::Lost;
    if (leading && now_ms - beat_ms > stall_limit_of(ttl_ms)) return LeaseStep::GiveUp;
    if (now_ms - renewed_ms >= renew_every_ms(ttl_ms)) return LeaseStep::Renew;
    return LeaseStep::Wait;
}

}  // namespace armada::cluster

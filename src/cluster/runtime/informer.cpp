#include "cluster/runtime/informer.h"

namespace armada::cluster {

Informer::Informer(KvStore & kv, std::string prefix, Clock & clock, int64_t relist_every_ms, common::Backoff backoff)
    : kv_(kv), prefix_(std::move(prefix)), clock_(clock), relist_every_ms_(relist_every_ms), backoff_(backoff) {}

int64_t Informer::retry_in_ms() const {
    return std::max<int64_t>(0, retry_at_ - clock_.now_ms());
}

void Informer::failed() {
    watch_.reset();
    retry_at_ = clock_.now_ms() + backoff_.next_ms();
}

bool Informer::list(std::vector<EtcdEvent> & changes, std::string & error) {
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    ++lists_;
    if (auto e = kv_.list(prefix_, kvs, rev); !e.empty()) {
        error = "listing " + prefix_ + ": " + e;
        list_failed_ = true;
        failed();
        return false;
    }
    // The difference from the last view: what went, then what is new or changed.
    std::map<std::string, EtcdKv> next;
    for (auto & kv : kvs)
        next.emplace(kv.key, std::move(kv));
    for (const auto & [key, old] : view_) {
        if (!next.count(key)) {
            // As etcd reports a delete: the key and the revision.
            EtcdEvent ev{EtcdEvent::Type::Delete, {}};
            ev.kv.key = key;
            ev.kv.mod_revision = rev;
            changes.push_back(std::move(ev));
        }
    }
    for (const auto & [key, kv] : next) {
        auto old = view_.find(key);
        if (old == view_.end() || old->second.mod_revision != kv.mod_revision || old->second.value != kv.value)
            changes.push_back({EtcdEvent::Type::Put, kv});
    }
    view_ = std::move(next);
    revision_ = rev;
    synced_ = true;
    listed_at_ = clock_.now_ms();
    watch_ = kv_.watch(prefix_, rev + 1);
    list_failed_ = false;
    // The back-off starts over only once the watch has proved itself (below): a watch that ends
    // as soon as it starts must not bring a list every 250 ms.
    return true;
}

bool Informer::poll(std::vector<EtcdEvent> & changes, int wait_ms, std::string & error) {
    const int64_t now = clock_.now_ms();
    if (watch_ && relist_every_ms_ > 0 && now - listed_at_ >= relist_every_ms_) watch_.reset();
    if (!watch_) {
        if (now < retry_at_) {
            error = "waiting " + std::to_string(retry_at_ - now) + " ms before listing " + prefix_ + " again";
            return false;
        }
        return list(changes, error);
    }
    std::vector<EtcdEvent> evs;
    std::string why;
    if (!watch_->take(evs, wait_ms, why)) {
        error = "the watch of " + prefix_ + " ended: " + why;
        failed();
        return false;
    }
    if (!evs.empty() || now - listed_at_ >= 5000) backoff_.reset();
    for (auto & ev : evs) {
        if (ev.type == EtcdEvent::Type::Put)
            view_[ev.kv.key] = ev.kv;
        else
            view_.erase(ev.kv.key);
        revision_ = std::max(revision_, ev.kv.mod_revision);
        changes.push_back(std::move(ev));
    }
    return true;
}

}  // namespace armada::cluster

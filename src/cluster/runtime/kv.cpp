#include "cluster/runtime/kv.h"

#include <algorithm>
#include <chrono>
#include <functional>

namespace armada::cluster {

namespace {

constexpr const char * kDown = "etcd is unreachable";
constexpr size_t kMaxHistory = 100000;  // changes kept for watches that start behind (auto-compaction)

bool under(const std::string & key, const std::string & prefix) {
    return key.compare(0, prefix.size(), prefix) == 0;
}

//! A watch streamed by EtcdClient on a thread of its own into a buffer `take` drains.
class EtcdWatch final : public KvWatch {
  public:
    EtcdWatch(EtcdClient etcd, std::string prefix, int64_t from) : etcd_(std::move(etcd)) {
        thread_ = std::thread([this, prefix = std::move(prefix), from] {
            std::string e = etcd_.watch(
                prefix, from,
                [this](const std::vector<EtcdEvent> & evs, int64_t) {
                    std::lock_guard lk(mu_);
                    events_.insert(events_.end(), evs.begin(), evs.end());
                    cv_.notify_all();
                    return !stop_.load();
                },
                stop_);
            std::lock_guard lk(mu_);
            error_ = e.empty() ? "the watch ended" : std::move(e);
            ended_ = true;
            cv_.notify_all();
        });
    }
    ~EtcdWatch() override {
        stop_ = true;
        thread_.join();
    }
    EtcdWatch(const EtcdWatch &) = delete;
    EtcdWatch & operator=(const EtcdWatch &) = delete;

    bool take(std::vector<EtcdEvent> & out, int wait_ms, std::string & error) override {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return !events_.empty() || ended_; });
        out.insert(out.end(), events_.begin(), events_.end());
        events_.clear();
        // Events that came before the end are handed out first.
        if (ended_ && out.empty()) {
            error = error_;
            return false;
        }
        return true;
    }

  private:
    EtcdClient etcd_;
    std::atomic<bool> stop_{false};
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<EtcdEvent> events_;
    bool ended_ = false;
    std::string error_;
    std::thread thread_;
};

}  // namespace

std::unique_ptr<KvWatch> EtcdKvStore::watch(const std::string & prefix, int64_t from_revision) {
    return std::make_unique<EtcdWatch>(etcd_, prefix, from_revision);
}

std::string EtcdKvStore::lease_grant(int64_t ttl_ms, int64_t & lease) {
    const int ttl_s = int(std::max<int64_t>(1, (ttl_ms + 999) / 1000));
    auto e = etcd_.grant(ttl_s, lease);
    if (e.empty()) {
        std::lock_guard lk(ttl_mu_);
        // Leases that ended without a revoke are forgotten first (the ids grow).
        while (ttl_ms_.size() >= 64)
            ttl_ms_.erase(ttl_ms_.begin());
        ttl_ms_[lease] = int64_t(ttl_s) * 1000;
    }
    return e;
}

int EtcdKvStore::keepalive_timeout_ms(int64_t lease) const {
    const int whole = etcd_.timeout_ms();
    std::lock_guard lk(ttl_mu_);
    const auto it = ttl_ms_.find(lease);
    if (it == ttl_ms_.end()) return whole;
    // A renewal comes a third of the TTL after the last, so two thirds are left for it, shared
    // by the endpoints it may have to try: one that hangs still leaves the next in time. With
    // one endpoint, a slow answer (a loaded etcd) gets all of it.
    const int64_t left = it->second * 2 / 3;
    const auto n = int64_t(std::max<size_t>(1, etcd_.endpoint_count()));
    return int(std::clamp<int64_t>(left / n, 200, whole));
}

std::string EtcdKvStore::lease_keepalive(int64_t lease, bool & alive) {
    int64_t ttl = 0;
    auto e = etcd_.keepalive(lease, ttl, keepalive_timeout_ms(lease));
    if (e.empty()) {
        alive = ttl > 0;
        if (!alive) {
            std::lock_guard lk(ttl_mu_);
            ttl_ms_.erase(lease);
        }
    }
    return e;
}

std::string EtcdKvStore::lease_revoke(int64_t lease) {
    {
        std::lock_guard lk(ttl_mu_);
        ttl_ms_.erase(lease);
    }
    return etcd_.revoke(lease);
}

// ---- MemoryKv ----

struct MemoryKv::Watcher {
    std::string prefix;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<EtcdEvent> events;
    bool ended = false;
    std::string error;

    void push(const EtcdEvent & ev) {
        std::lock_guard lk(mu);
        if (ended) return;
        events.push_back(ev);
        cv.notify_all();
    }
    void end(const std::string & why) {
        std::lock_guard lk(mu);
        if (ended) return;
        ended = true;
        error = why;
        cv.notify_all();
    }
};

namespace {

class MemoryWatch final : public KvWatch {
  public:
    explicit MemoryWatch(std::shared_ptr<void> w,
                         std::function<bool(std::vector<EtcdEvent> &, int, std::string &)> take)
        : keep_(std::move(w)), take_(std::move(take)) {}
    bool take(std::vector<EtcdEvent> & out, int wait_ms, std::string & error) override {
        return take_(out, wait_ms, error);
    }

  private:
    std::shared_ptr<void> keep_;
    std::function<bool(std::vector<EtcdEvent> &, int, std::string &)> take_;
};

}  // namespace

EtcdEvent MemoryKv::deleted(const std::string & key, int64_t revision) {
    // As etcd reports a delete (without prev_kv): the key and the revision, nothing else.
    EtcdEvent ev{EtcdEvent::Type::Delete, {}};
    ev.kv.key = key;
    ev.kv.mod_revision = revision;
    return ev;
}

void MemoryKv::emit(const EtcdEvent & ev) {
    history_.emplace_back(revision_, ev);
    if (retention_ms_ == 0 && history_.size() > kMaxHistory) {
        compacted_ = history_.front().first;
        history_.pop_front();
    }
    std::erase_if(watchers_, [](const auto & w) { return w.expired(); });
    for (const auto & weak : watchers_) {
        if (auto w = weak.lock(); w && under(ev.kv.key, w->prefix)) w->push(ev);
    }
}

std::string MemoryKv::get(const std::string & key, std::optional<EtcdKv> & out) {
    std::lock_guard lk(mu_);
    if (down_) return kDown;
    ++calls_;
    out.reset();
    if (auto it = keys_.find(key); it != keys_.end()) out = it->second;
    return {};
}

std::string MemoryKv::list(const std::string & prefix, std::vector<EtcdKv> & out, int64_t & revision) {
    std::lock_guard lk(mu_);
    if (down_) return kDown;
    ++calls_;
    out.clear();
    for (auto it = keys_.lower_bound(prefix); it != keys_.end() && under(it->first, prefix); ++it)
        out.push_back(it->second);
    keys_listed_ += int64_t(out.size());
    revision = revision_;
    return {};
}

std::string MemoryKv::put_locked(const std::string & key, const std::string & value, int64_t lease) {
    if (lease != 0 && !leases_.count(lease)) return "etcdserver: requested lease not found";
    EtcdKv & kv = keys_[key];
    if (kv.create_revision == 0) kv.create_revision = revision_;
    kv.key = key;
    kv.value = value;
    kv.mod_revision = revision_;
    kv.lease = lease;
    emit({EtcdEvent::Type::Put, kv});
    return {};
}

std::string MemoryKv::put(const std::string & key, const std::string & value, int64_t lease) {
    std::lock_guard lk(mu_);
    if (down_) return kDown;
    ++calls_;
    if (lease != 0 && !leases_.count(lease)) return "etcdserver: requested lease not found";
    ++revision_;
    ++writes_;
    return put_locked(key, value, lease);
}

std::string MemoryKv::erase(const std::string & key) {
    std::lock_guard lk(mu_);
    if (down_) return kDown;
    ++calls_;
    auto it = keys_.find(key);
    if (it == keys_.end()) return {};
    ++revision_;
    ++writes_;
    emit(deleted(it->first, revision_));
    keys_.erase(it);
    return {};
}

std::string MemoryKv::erase_if_created(const std::string & key, int64_t create_revision, bool & erased) {
    std::lock_guard lk(mu_);
    if (down_) return kDown;
    ++calls_;
    auto it = keys_.find(key);
    erased = it != keys_.end() && it->second.create_revision == create_revision;
    if (!erased) return {};
    ++revision_;
    ++writes_;
    emit(deleted(it->first, revision_));
    keys_.erase(it);
    return {};
}

std::string MemoryKv::txn(const std::vector<EtcdCompare> & compares,
                          const std::vector<std::pair<std::string, std::string>> & puts, bool & succeeded,
                          int64_t & revision) {
    std::lock_guard lk(mu_);
    if (down_) return kDown;
    ++calls_;
    succeeded = true;
    for (const auto & c : compares) {
        auto it = keys_.find(c.key);
        const int64_t have = it == keys_.end() ? 0
                                               : (c.target == EtcdCompare::Target::Create ? it->second.create_revision
                                                                                          : it->second.mod_revision);
        if (have != c.revision) succeeded = false;
    }
    if (succeeded && !puts.empty()) {
        ++revision_;
        ++writes_;
        for (const auto & [k, v] : puts)
            put_locked(k, v, 0);
    }
    revision = revision_;
    return {};
}

std::unique_ptr<KvWatch> MemoryKv::watch(const std::string & prefix, int64_t from_revision) {
    auto w = std::make_shared<Watcher>();
    w->prefix = prefix;
    {
        std::lock_guard lk(mu_);
        if (down_) {
            w->end(kDown);
        } else if (from_revision > 0 && from_revision <= compacted_) {
            w->end("etcdserver: mvcc: required revision has been compacted");
        } else {
            if (from_revision > 0)
                for (const auto & [rev, ev] : history_)
                    if (rev >= from_revision && under(ev.kv.key, prefix)) w->push(ev);
            watchers_.push_back(w);
        }
    }
    return std::make_unique<MemoryWatch>(w, [w](std::vector<EtcdEvent> & out, int wait_ms, std::string & error) {
        std::unique_lock lk(w->mu);
        if (wait_ms > 0)
            w->cv.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return !w->events.empty() || w->ended; });
        out.insert(out.end(), w->events.begin(), w->events.end());
        w->events.clear();
        if (w->ended && out.empty()) {
            error = w->error;
            return false;
        }
        return true;
    });
}

std::string MemoryKv::status(EtcdStatus & out, bool & alarms_known) {
    std::lock_guard lk(mu_);
    if (down_) return kDown;
    ++calls_;
    // Per entry: its key and value, and about 64 bytes of revision and index bookkeeping.
    int64_t live = 0, history = 0;
    for (const auto & [k, kv] : keys_)
        live += int64_t(k.size() + kv.value.size()) + 64;
    for (const auto & [rev, ev] : history_)
        history += int64_t(ev.kv.key.size() + ev.kv.value.size()) + 64;
    out = {};
    out.db_in_use_bytes = live + history;
    out.db_bytes = std::max(db_high_, out.db_in_use_bytes);  // a backend file does not shrink by itself
    db_high_ = out.db_bytes;
    out.revision = revision_;
    out.version = "memory";
    alarms_known = true;
    return {};
}

int64_t MemoryKv::grant(int64_t ttl_ms) {
    std::lock_guard lk(mu_);
    const int64_t id = ++next_lease_;
    leases_[id] = {ttl_ms, ttl_ms > 0 && clock_ ? clock_->now_ms() + ttl_ms : 0};
    return id;
}

int MemoryKv::keepalive(int64_t lease) {
    std::lock_guard lk(mu_);
    if (down_) return -1;
    ++calls_;
    auto it = leases_.find(lease);
    if (it == leases_.end()) return 0;
    if (it->second.deadline > 0) it->second.deadline = clock_->now_ms() + it->second.ttl_ms;
    return 1;
}

void MemoryKv::expire_leases() {
    std::vector<int64_t> gone;
    {
        std::lock_guard lk(mu_);
        if (down_ || !clock_) return;
        const int64_t now = clock_->now_ms();
        for (const auto & [id, l] : leases_)
            if (l.deadline > 0 && l.deadline <= now) gone.push_back(id);
        if (retention_ms_ > 0 && now - retention_at_ >= retention_ms_) {
            // Compact to the revision marked one period ago, and mark this one.
            while (!history_.empty() && history_.front().first <= retention_mark_) {
                compacted_ = history_.front().first;
                history_.pop_front();
            }
            retention_mark_ = revision_;
            retention_at_ = now;
        }
    }
    for (int64_t id : gone)
        revoke(id);
}

void MemoryKv::revoke(int64_t lease) {
    std::lock_guard lk(mu_);
    if (down_ || !leases_.erase(lease)) return;
    bool any = false;
    for (auto it = keys_.begin(); it != keys_.end();) {
        if (it->second.lease != lease) {
            ++it;
            continue;
        }
        if (!any) {
            ++revision_;
            ++writes_;
        }
        any = true;
        emit(deleted(it->first, revision_));
        it = keys_.erase(it);
    }
}

std::string MemoryKv::lease_grant(int64_t ttl_ms, int64_t & lease) {
    {
        std::lock_guard lk(mu_);
        if (down_) return kDown;
        ++calls_;
    }
    lease = grant(ttl_ms);
    return {};
}

std::string MemoryKv::lease_keepalive(int64_t lease, bool & alive) {
    const int k = keepalive(lease);
    if (k < 0) return kDown;
    alive = k > 0;
    return {};
}

std::string MemoryKv::lease_revoke(int64_t lease) {
    {
        std::lock_guard lk(mu_);
        if (down_) return kDown;
        ++calls_;
    }
    revoke(lease);
    return {};
}

void MemoryKv::set_down(bool down) {
    std::vector<std::shared_ptr<Watcher>> ending;
    {
        std::lock_guard lk(mu_);
        down_ = down;
        if (!down) {
            // Back, etcd gives every lease a fresh TTL: nobody could renew while it was away.
            for (auto & [id, l] : leases_)
                if (l.deadline > 0) l.deadline = clock_->now_ms() + l.ttl_ms;
            return;
        }
        for (const auto & weak : watchers_)
            if (auto w = weak.lock()) ending.push_back(std::move(w));
        watchers_.clear();
    }
    for (const auto & w : ending)
        w->end(kDown);
}

void MemoryKv::set_retention(int64_t ms) {
    std::lock_guard lk(mu_);
    retention_ms_ = std::max<int64_t>(0, ms);
    retention_at_ = clock_ ? clock_->now_ms() : 0;
    retention_mark_ = revision_;
}

void MemoryKv::compact() {
    std::lock_guard lk(mu_);
    compacted_ = revision_;
    history_.clear();
}

MemoryKv::Snapshot MemoryKv::snapshot() const {
    std::lock_guard lk(mu_);
    return {keys_, leases_, revision_};
}

void MemoryKv::restore(const Snapshot & s) {
    std::vector<std::shared_ptr<Watcher>> ending;
    {
        std::lock_guard lk(mu_);
        keys_ = s.keys;
        revision_ = s.revision;
        // The snapshot's leases come back with a fresh TTL, as a restored etcd's do; a holder
        // that renews them keeps them, the rest expire.
        leases_ = s.leases;
        for (auto & [id, l] : leases_)
            if (l.deadline > 0) l.deadline = clock_->now_ms() + l.ttl_ms;
        history_.clear();
        compacted_ = revision_;  // a watch from before the restore is told it is gone
        // Leases live on as they were (a restore keeps the lease table it was taken with; the
        // simulator's leases are its own).
        for (const auto & weak : watchers_)
            if (auto w = weak.lock()) ending.push_back(std::move(w));
        watchers_.clear();
    }
    for (const auto & w : ending)
        w->end("etcd was restored from a snapshot");
}

int64_t MemoryKv::revision() const {
    std::lock_guard lk(mu_);
    return revision_;
}

int64_t MemoryKv::calls() const {
    std::lock_guard lk(mu_);
    return calls_;
}

int64_t MemoryKv::writes() const {
    std::lock_guard lk(mu_);
    return writes_;
}

int64_t MemoryKv::keys_listed() const {
    std::lock_guard lk(mu_);
    return keys_listed_;
}

}  // namespace armada::cluster

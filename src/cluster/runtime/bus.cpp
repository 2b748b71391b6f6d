#include "cluster/runtime/bus.h"

#include "cluster/queue.h"

#include <algorithm>

namespace armada::cluster {

std::string JetStreamBus::publish(const std::string & subject, const std::string & data, const std::string & msg_id,
                                  int max_wait_ms) {
    return js_.publish(subject, data, msg_id, max_wait_ms);
}

std::string JetStreamBus::publish_async(const std::string & subject, const std::string & data,
                                        const std::string & msg_id) {
    return js_.publish_async(subject, data, msg_id);
}

std::string JetStreamBus::publish_now(const std::string & subject, const std::string & data) {
    return js_.publish_now(subject, data);
}

namespace {

class SubscriptionListener final : public Listener {
  public:
    explicit SubscriptionListener(std::unique_ptr<Subscription> s) : s_(std::move(s)) {}
    std::vector<std::pair<std::string, std::string>> take(int max, int wait_ms) override {
        return s_->take(max, wait_ms);
    }

  private:
    std::unique_ptr<Subscription> s_;
};

}  // namespace

std::unique_ptr<Listener> JetStreamBus::subscribe(const std::string & subject, std::string & error) {
    auto s = js_.subscribe(subject, error);
    if (!s) return nullptr;
    return std::make_unique<SubscriptionListener>(std::move(s));
}

ConsumerInbox::ConsumerInbox(std::unique_ptr<Consumer> c) : c_(std::move(c)) {}
ConsumerInbox::~ConsumerInbox() = default;

std::vector<BusMsg> ConsumerInbox::fetch(int batch, int wait_ms, std::string & error) {
    std::vector<BusMsg> out;
    for (auto & m : c_->fetch(batch, wait_ms, error)) {
        auto held = std::make_shared<QueueMsg>(std::move(m));
        out.push_back({held->subject(), held->data(), held->deliveries(), [held] { held->ack(); }});
    }
    return out;
}

// ---- MemoryBus ----

class MemoryInbox final : public Inbox {
  public:
    MemoryInbox(MemoryBus & bus, std::string filter) : bus_(bus), filter_(std::move(filter)) {}
    std::vector<BusMsg> fetch(int batch, int /*wait_ms*/, std::string & error) override {
        return bus_.take(filter_, batch, error);
    }

  private:
    MemoryBus & bus_;
    std::string filter_;
};

bool MemoryBus::matches(const std::string & filter, const std::string & subject) {
    if (filter.size() >= 2 && filter.compare(filter.size() - 2, 2, ".>") == 0)
        return subject.compare(0, filter.size() - 1, filter, 0, filter.size() - 1) == 0 &&
               subject.size() > filter.size() - 1;
    return filter == subject;
}

std::string MemoryBus::publish_async(const std::string & subject, const std::string & data,
                                     const std::string & msg_id) {
    std::lock_guard lk(mu_);
    if (down_) return "nats: no server available for connection";
    ++published_;
    if (keep_sent_) kept_.emplace_back(subject, data);
    if (!msg_id.empty() && ids_.count(msg_id)) return {};
    auto p = std::make_shared<Pending>();
    p->subject = subject;
    p->data = data;
    p->id = ++next_id_;
    if (!msg_id.empty()) ids_[msg_id] = p->id;
    queue_[subject].push_back(std::move(p));
    return {};
}

std::string MemoryBus::publish_now(const std::string & subject, const std::string & data) {
    std::lock_guard lk(mu_);
    if (down_) return "nats: no server available for connection";
    ++published_;
    if (keep_sent_) now_.emplace_back(subject, data);
    std::erase_if(listeners_, [](const auto & w) { return w.expired(); });
    for (const auto & weak : listeners_)
        if (auto l = weak.lock(); l && matches(l->filter, subject)) l->got.emplace_back(subject, data);
    return {};
}

class MemoryListener final : public Listener {
  public:
    MemoryListener(std::mutex & mu, std::shared_ptr<void> keep, std::deque<std::pair<std::string, std::string>> & got)
        : mu_(mu), keep_(std::move(keep)), got_(got) {}
    std::vector<std::pair<std::string, std::string>> take(int max, int /*wait_ms*/) override {
        std::lock_guard lk(mu_);
        std::vector<std::pair<std::string, std::string>> out;
        while (!got_.empty() && int(out.size()) < max) {
            out.push_back(std::move(got_.front()));
            got_.pop_front();
        }
        return out;
    }

  private:
    std::mutex & mu_;
    std::shared_ptr<void> keep_;
    std::deque<std::pair<std::string, std::string>> & got_;
};

std::unique_ptr<Listener> MemoryBus::subscribe(const std::string & subject, std::string & error) {
    std::lock_guard lk(mu_);
    if (down_) {
        error = "nats: no server available for connection";
        return nullptr;
    }
    auto l = std::make_shared<Listening>();
    l->filter = subject;
    listeners_.push_back(l);
    return std::make_unique<MemoryListener>(mu_, l, l->got);
}

std::unique_ptr<Inbox> MemoryBus::inbox(const std::string & filter) {
    return std::make_unique<MemoryInbox>(*this, filter);
}

std::vector<BusMsg> MemoryBus::take(const std::string & filter, int batch, std::string & error) {
    std::lock_guard lk(mu_);
    std::vector<BusMsg> out;
    if (down_) {
        error = "nats: no server available for connection";
        return out;
    }
    // Acked messages leave; one fetched before and not acked is delivered again (its ack wait is
    // taken to have passed by the next fetch). Across subjects, in the order they were published.
    std::vector<std::shared_ptr<Pending>> due;
    for (Queue * q : queues(filter)) {
        std::erase_if(*q, [](const auto & p) { return p->acked; });
        for (size_t i = 0; i < q->size() && int(i) < batch; ++i)
            due.push_back((*q)[i]);
    }
    std::sort(due.begin(), due.end(), [](const auto & a, const auto & b) { return a->id < b->id; });
    if (int(due.size()) > batch) due.resize(size_t(std::max(0, batch)));
    for (const auto & p : due) {
        ++p->deliveries;
        std::weak_ptr<Pending> w = p;
        out.push_back({p->subject, p->data, p->deliveries, [w, this] {
                           std::lock_guard lk2(mu_);
                           if (auto q = w.lock()) q->acked = true;
                       }});
    }
    return out;
}

int64_t MemoryBus::published() const {
    std::lock_guard lk(mu_);
    return published_;
}

void MemoryBus::keep_sent(bool keep) {
    std::lock_guard lk(mu_);
    keep_sent_ = keep;
}

void MemoryBus::set_down(bool down) {
    std::lock_guard lk(mu_);
    down_ = down;
}

std::vector<std::pair<std::string, std::string>> MemoryBus::sent_now() const {
    std::lock_guard lk(mu_);
    return now_;
}

std::vector<std::pair<std::string, std::string>> MemoryBus::sent_kept() const {
    std::lock_guard lk(mu_);
    return kept_;
}

size_t MemoryBus::waiting(const std::string & filter) const {
    std::lock_guard lk(mu_);
    size_t n = 0;
    for (const auto & [subject, q] : queue_)
        if (matches(filter, subject))
            for (const auto & p : q)
                n += p->acked ? 0 : 1;
    return n;
}

std::vector<MemoryBus::Queue *> MemoryBus::queues(const std::string & filter) {
    std::vector<Queue *> out;
    if (filter.size() >= 2 && filter.compare(filter.size() - 2, 2, ".>") == 0) {
        const std::string prefix = filter.substr(0, filter.size() - 1);
        for (auto it = queue_.lower_bound(prefix); it != queue_.end() && it->first.rfind(prefix, 0) == 0; ++it)
            if (it->first.size() > prefix.size()) out.push_back(&it->second);
    } else if (auto it = queue_.find(filter); it != queue_.end()) {
        out.push_back(&it->second);
    }
    return out;
}

}  // namespace armada::cluster

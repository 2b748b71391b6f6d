#pragma once

// The messaging the cluster's runners talk over: JetStream in the processes, an in-memory bus in
// unit tests and the simulator. A work queue's message goes to one taker and must be acked;
// `publish_async` never waits for the server; `publish_now` is core NATS (not kept).

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace armada::cluster {

class Consumer;
class JetStream;

struct BusMsg {
    std::string subject, data;
    uint64_t deliveries = 1;
    std::function<void()> ack;  // never empty
};

//! One durable consumer: the messages on its subjects, each to one taker.
class Inbox {
  public:
    virtual ~Inbox() = default;
    //! Up to `batch` messages, waiting up to `wait_ms` for the first.
    virtual std::vector<BusMsg> fetch(int batch, int wait_ms, std::string & error) = 0;
};

//! A subscription to messages that are not kept (core NATS): each listener gets each one.
class Listener {
  public:
    virtual ~Listener() = default;
    //! What came since the last take as (subject, data), at most `max`, waiting up to `wait_ms`
    //! for the first.
    virtual std::vector<std::pair<std::string, std::string>> take(int max, int wait_ms) = 0;
};

class Bus {
  public:
    virtual ~Bus() = default;
    //! Kept by the stream once it acknowledges, which it waits for up to `max_wait_ms`.
    virtual std::string publish(const std::string & subject, const std::string & data, const std::string & msg_id,
                                int max_wait_ms) = 0;
    //! Kept by the stream; the ack is awaited off the caller's thread. `msg_id` deduplicates.
    virtual std::string publish_async(const std::string & subject, const std::string & data,
                                      const std::string & msg_id) = 0;
    //! To whoever listens now; not kept.
    virtual std::string publish_now(const std::string & subject, const std::string & data) = 0;
    //! Listens to `subject` (a trailing ".>" matches every subject under it).
    virtual std::unique_ptr<Listener> subscribe(const std::string & subject, std::string & error) = 0;
};

//! JetStream and one of its consumers behind the seams.
class JetStreamBus final : public Bus {
  public:
    explicit JetStreamBus(JetStream & js) : js_(js) {}
    std::string publish(const std::string & subject, const std::string & data, const std::string & msg_id,
                        int max_wait_ms) override;
    std::string publish_async(const std::string & subject, const std::string & data,
                              const std::string & msg_id) override;
    std::string publish_now(const std::string & subject, const std::string & data) override;
    std::unique_ptr<Listener> subscribe(const std::string & subject, std::string & error) override;

  private:
    JetStream & js_;
};

class ConsumerInbox final : public Inbox {
  public:
    explicit ConsumerInbox(std::unique_ptr<Consumer> c);
    ~ConsumerInbox() override;
    std::vector<BusMsg> fetch(int batch, int wait_ms, std::string & error) override;

  private:
    std::unique_ptr<Consumer> c_;
};

//! A bus in memory: subjects whose messages wait until an inbox for them takes them (an inbox's
//! filter is a subject, or a prefix ending in ".>"), and everything published, for tests to read.
//! A message fetched and not acked is delivered again by the next fetch (its ack wait is taken to
//! have passed). `set_down` fails every call. Thread-safe.
class MemoryBus final : public Bus {
  public:
    std::string publish(const std::string & subject, const std::string & data, const std::string & msg_id,
                        int /*max_wait_ms*/) override {
        return publish_async(subject, data, msg_id);
    }
    std::string publish_async(const std::string & subject, const std::string & data,
                              const std::string & msg_id) override;
    std::string publish_now(const std::string & subject, const std::string & data) override;
    std::unique_ptr<Listener> subscribe(const std::string & subject, std::string & error) override;
    std::unique_ptr<Inbox> inbox(const std::string & filter);
    void set_down(bool down);
    //! What was published with publish_now, and with publish_async, in order.
    std::vector<std::pair<std::string, std::string>> sent_now() const;
    std::vector<std::pair<std::string, std::string>> sent_kept() const;
    //! Messages waiting for a taker on subjects matching `filter`.
    size_t waiting(const std::string & filter) const;
    //! Messages published, both kinds (counted whether or not they are kept for sent_*).
    int64_t published() const;
    //! Whether sent_now and sent_kept keep what was published (on by default; a long run at
    //! scale turns it off).
    void keep_sent(bool keep);

  private:
    friend class MemoryInbox;
    struct Pending {
        std::string subject, data;
        uint64_t deliveries = 0;
        int64_t id = 0;
        bool acked = false;
    };
    static bool matches(const std::string & filter, const std::string & subject);
    std::vector<BusMsg> take(const std::string & filter, int batch, std::string & error);

    mutable std::mutex mu_;
    bool down_ = false;
    int64_t next_id_ = 0;
    using Queue = std::deque<std::shared_ptr<Pending>>;
    //! The queues of the subjects matching `filter` (one, or every one under a `.>` prefix).
    std::vector<Queue *> queues(const std::string & filter);
    std::map<std::string, Queue> queue_;  // subject → its messages in order
    std::map<std::string, int64_t> ids_;  // msg_id → message (deduplication)
    std::vector<std::pair<std::string, std::string>> now_, kept_;
    bool keep_sent_ = true;
    int64_t published_ = 0;
    struct Listening {
        std::string filter;
        std::deque<std::pair<std::string, std::string>> got;
    };
    std::vector<std::weak_ptr<Listening>> listeners_;
};

}  // namespace armada::cluster

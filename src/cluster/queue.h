#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cluster/service_auth.h"

// libnats' own type names, declared here so its header stays out of ours.
struct __natsConnection;    // NOLINT(bugprone-reserved-identifier)
struct __jsCtx;             // NOLINT(bugprone-reserved-identifier)
struct __natsSubscription;  // NOLINT(bugprone-reserved-identifier)
struct __natsMsg;           // NOLINT(bugprone-reserved-identifier)
struct natsMsgList;

namespace armada::cluster {

//! The subjects the levels of a cluster talk over, each carried by a JetStream stream with file
//! storage:
//!   armada.place.<cell>   gateway → cell brain: a session to place      (stream ARMADA_PLACE, work queue)
//!   armada.cmd.<node>     cell brain → node: run this session           (stream ARMADA_CMD, work queue)
//!   armada.event.<cell>   node → brain: a session ended, a node drains  (stream ARMADA_EVENT, kept 1 h)
//!   armada.dead.<subject> what was delivered `max_deliver` times without an ack (ARMADA_DEAD, kept 7 d)
//! and one carried by core NATS, not kept (a report missed is replaced by the next one):
//!   armada.report.<cell>  cell brain → global brains: the cell's aggregate, about once a second
std::string place_subject(const std::string & cell);
std::string command_subject(const std::string & node);
std::string event_subject(const std::string & cell);
std::string report_subject(const std::string & cell);

//! One delivered message of a pull consumer. It must be acked (done), nak'ed (deliver again
//! later) or sent to the dead letters; if nothing is said before the consumer's ack wait, the
//! server delivers it again.
class QueueMsg {
  public:
    ~QueueMsg();
    QueueMsg(QueueMsg &&) noexcept;
    QueueMsg(const QueueMsg &) = delete;
    const std::string & subject() const { return subject_; }
    const std::string & data() const { return data_; }
    //! 1 on the first delivery.
    uint64_t deliveries() const { return deliveries_; }
    //! Sent without waiting for the server's confirmation (a loop never waits on a NATS that
    //! hangs); an ack the server never gets redelivers the message after the consumer's ack wait.
    std::string ack();
    std::string nak(int delay_ms = 0);
    //! Stops redelivery (the caller has put it in the dead letters).
    std::string term();

  private:
    friend class Consumer;
    explicit QueueMsg(__natsMsg * m);
    __natsMsg * m_;
    std::string subject_, data_;
    uint64_t deliveries_ = 1;
};

class JetStream;

//! A core NATS subscription (nothing kept, every subscriber gets every message); libnats
//! subscribes again by itself after a reconnect.
class Subscription {
  public:
    ~Subscription();
    Subscription(const Subscription &) = delete;
    //! What arrived since the last call as (subject, data), at most `max`, waiting up to
    //! `wait_ms` for the first.
    std::vector<std::pair<std::string, std::string>> take(int max, int wait_ms);

  private:
    friend class JetStream;
    Subscription() = default;
    __natsSubscription * sub_ = nullptr;
};

//! A durable pull consumer on a subject filter: any number of processes can fetch from the same
//! durable consumer (the cell's brains, whoever leads), and each message goes to one of them.
class Consumer {
  public:
    ~Consumer();
    //! Up to `batch` messages, waiting at most `wait_ms` for the first. Messages delivered more
    //! than `max_deliver` times are moved to the dead letters here and not returned.
    std::vector<QueueMsg> fetch(int batch, int wait_ms, std::string & error);

  private:
    friend class JetStream;
    Consumer() = default;
    //! Moves `list`'s messages to `out`, sending those delivered too often to the dead letters.
    void take(natsMsgList & list, std::vector<QueueMsg> & out);
    JetStream * js_ = nullptr;
    __natsSubscription * sub_ = nullptr;
    int max_deliver_ = 5;
};

//! NATS JetStream through libnats. Reconnects by itself (forever, with jitter) when the server
//! goes away; a publish made while disconnected fails with an error the caller retries.
//! libnats runs its callbacks on its own threads: nothing here posts into Asio; callers use it
//! from threads of their own.
class JetStream {
  public:
    //! Connects (`nats://host:port`, comma-separated for a cluster) and creates the streams
    //! (idempotent: an existing stream with the same settings is fine). With `auth` it connects
    //! as its user, and over TLS when it names a CA or a certificate.
    static std::unique_ptr<JetStream> connect(const std::string & url, std::string & error,
                                              const ServiceCredentials & auth = {});
    ~JetStream();
    JetStream(const JetStream &) = delete;

    //! Publishes and waits for the stream's ack. A non-empty `msg_id` deduplicates a repeated
    //! publish within the stream's window (2 minutes).
    //! `max_wait_ms` bounds the wait for the ack (it may then still be stored).
    std::string publish(const std::string & subject, const std::string & data, const std::string & msg_id = {},
                        int max_wait_ms = 5000);
    //! Publishes without waiting for the ack (a leader's loop, a gateway's request): libnats
    //! awaits it on its own thread, and a publish the stream does not acknowledge within 5 s is
    //! logged and counted (async_failures). While libnats reconnects the message waits in its
    //! reconnect buffer (and may go later); with kAsyncWindow publishes waiting for acks, the
    //! call fails after 50 ms. Whoever publishes this way must also find the work another way
    //! (the brains' reconcile does); message ids make a late duplicate harmless.
    std::string publish_async(const std::string & subject, const std::string & data, const std::string & msg_id = {});
    static constexpr int kAsyncWindow = 4096;
    //! Asynchronous publishes the stream did not acknowledge.
    int64_t async_failures() const { return async_failures_.load(); }
    //! A durable pull consumer on `stream` for `filter`, with explicit ack, `ack_wait_ms` before
    //! redelivery and at most `max_deliver` deliveries.
    std::unique_ptr<Consumer> consumer(const std::string & stream, const std::string & durable,
                                       const std::string & filter, int ack_wait_ms, int max_deliver,
                                       std::string & error);
    //! Core NATS: sent to whoever subscribes now, without an ack and not kept.
    std::string publish_now(const std::string & subject, const std::string & data);
    //! A core NATS subscription to `subject` (wildcards allowed).
    std::unique_ptr<Subscription> subscribe(const std::string & subject, std::string & error);
    //! Messages in a stream now (tests, metrics).
    int64_t stream_messages(const std::string & stream, std::string & error);

  private:
    friend class Consumer;
    JetStream() = default;
    std::string ensure_streams();
    __natsConnection * nc_ = nullptr;
    __jsCtx * js_ = nullptr;
    std::atomic<int64_t> async_failures_{0};
};

}  // namespace armada::cluster

#pragma once

// Agent sessions through the gateway. A new session is a row in the store, written here, and a
// place request to its cell's brain on NATS (the brain's reconcile finds the row even if that is
// lost). Every other request for a session goes to the node that holds it, found in the store and
// checked against etcd, and its event stream follows it from node to node with Last-Event-ID.
// A node that holds its lease and does not answer keeps the session: the client is told to retry.
//
// Owns: session creation, the holder lookup, session relaying and the event-stream relay, with
// each tenant's cap of open streams. It may include the relay, the cluster view, the quotas, the
// queue and the store interface; not the admin routes or the generation router.

#include "api/auth.h"
#include "api/http_server.h"
#include "cluster/queue.h"
#include "cluster/quota.h"
#include "cluster/redis.h"
#include "gateway/cluster_view.h"
#include "gateway/counters.h"
#include "gateway/key_directory.h"
#include "gateway/relay.h"
#include "store/store.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace armada::gateway {

class SessionApi {
  public:
    struct Options {
        std::string cell;  // where new sessions go ("" picks a cell)
        size_t max_streams_per_tenant = 256;
    };
    //! `redis` may be null (no route cache).
    SessionApi(ClusterView & view, NodeRelay & relay, store::Store & st, cluster::JetStream & js,
               cluster::RedisPool * redis, cluster::Quotas & quotas, GatewayCounters & counts, Options o)
        : view_(view),
          relay_(relay),
          store_(st),
          js_(js),
          redis_(redis),
          quotas_(quotas),
          counts_(counts),
          o_(std::move(o)) {}

    //! POST /v1/agents/{agent}/sessions.
    void create(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out, const Authed & authed,
                const std::string & agent_id);
    //! /v1/sessions/{id}[/{sub}]: to the session's holder (its event stream followed as it moves).
    void route(api::HttpRequest & req, const std::shared_ptr<api::Responder> & out, const api::Caller & caller,
               const std::string & id, const std::string & sub);

  private:
    //! The session's event stream, from whichever node holds it; when it moves (its node died,
    //! hung or was fenced) the stream goes on from the new node with Last-Event-ID. Only whole
    //! events reach the client, so a reconnect never repeats or splits one.
    void events(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out, const std::string & id);
    //! Writes `b`, clearing an earlier failure of the store first (PostgreSQL restarted), and
    //! tries once more after a pause if the write fails.
    store::Status commit(store::Batch b);
    //! The session's row; nullopt with `unavailable` set when the store cannot be read now (so
    //! that a client is told to retry, not that its session does not exist).
    std::optional<store::SessionRecord> lookup(const std::string & id, bool & unavailable);

    //! A tenant's open event streams, held for as long as a stream is open.
    struct StreamSlot {
        SessionApi & api;
        std::string tenant;
        bool held = false;
        StreamSlot(SessionApi & a, std::string t);
        ~StreamSlot();
        StreamSlot(const StreamSlot &) = delete;
        StreamSlot & operator=(const StreamSlot &) = delete;
    };

    ClusterView & view_;
    NodeRelay & relay_;
    store::Store & store_;
    cluster::JetStream & js_;
    cluster::RedisPool * redis_;
    cluster::Quotas & quotas_;
    GatewayCounters & counts_;
    Options o_;
    std::atomic<int64_t> nats_slow_at_{0};  // when a place request's publish last failed
    std::mutex streams_mu_;
    std::map<std::string, size_t> streams_;  // tenant → open streams; streams_mu_
};

}  // namespace armada::gateway

#pragma once

// `armada gateway`: the single entry of a cluster, with the API of a node. It checks API keys as a
// node does, writes new sessions to PostgreSQL and asks their cell to place them, and forwards
// everything else to a node: a session's requests and event stream to the node holding it
// (following it when it moves, with Last-Event-ID), chat completions by prompt-prefix affinity,
// the rest by load. Tenants and their keys live in PostgreSQL (its /admin API); their quotas are
// enforced with the other gateways through Redis. It keeps no state of its own: run as many as
// needed.
//
// `Gateway` checks each request, authenticates it, applies the quotas, and hands it to the unit
// that answers it:
//   cluster_view.h      the cluster as etcd shows it (nodes, cells, split), and choices on it
//   key_directory.h     API keys: the gateway's own and the tenants' in PostgreSQL
//   relay.h             forwarding to nodes and pools, passed-through headers, usage scan
//   affinity.h          a chat conversation's node
//   generation_router.h where a completion goes when there are GPU pools (a pure plan, then its run)
//   session_api.h       session creation, the holder lookup, event streams that follow a move
//   admin_api.h         /admin: tenants, keys, pools
//   dashboard_feed.h    /dashboard and its live feed
//   counters.h          what /metrics shows (gateway_metrics.cpp renders it)
// The command (flags, signals) is in cli/gateway_command.cpp.

#include "api/auth.h"
#include "api/http_server.h"
#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "gateway/checks.h"
#include "gateway/counters.h"
#include "gateway/worker_pool.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace armada::cluster {
class EtcdKvStore;
class JetStream;
class Quotas;
class RedisPool;
struct QuotaRefusal;
}  // namespace armada::cluster

namespace armada::routing {
class PoolSet;
}

namespace armada::store {
class ClusterStore;
}

namespace armada::gateway {

struct GatewayOptions {
    std::string cluster_file;
    api::HttpConfig http;
    std::string api_key;
    std::string api_key_file;
    std::string cell;  // where new sessions go; "" picks the cell with the most room
    std::string name;  // among the live gateways in etcd; "" is HOST-PORT
    std::string log_level = "info";
    int affinity_ttl_s = 600;
    //! Worker threads alive at once: each request (and each open event stream) holds one while it
    //! runs. Beyond it a request gets 503 and Retry-After.
    size_t max_workers = 1024;
    //! A tenant's concurrent session event streams through this gateway; beyond it, 429.
    size_t max_streams_per_tenant = 256;
    //! Reads (GET, DELETE, event streams opened) a key may make a minute, shared by the gateways
    //! as rpm is; beyond it, 429. Admin keys are not counted. 0: no limit.
    int64_t reads_per_minute = 6000;
};

class AdminApi;
class ChatAffinity;
class ClusterView;
class DashboardFeed;
class GenerationRouter;
class KeyDirectory;
class NodeRelay;
class PromptCounter;
class SessionApi;
struct Authed;

class Gateway {
  public:
    Gateway(cluster::ClusterConfig cfg, GatewayOptions o, api::ApiKeys keys);
    ~Gateway();
    Gateway(const Gateway &) = delete;
    Gateway & operator=(const Gateway &) = delete;

    //! Connects to PostgreSQL, NATS, Redis and the pools, and reads the cluster once; an error
    //! says which could not be reached.
    std::string start();
    //! Joins the live gateways in etcd as `name` (at `url`) and starts following the cluster.
    void announce(const std::string & name, const std::string & url);
    void stop();
    //! SIGHUP: the cluster file read again for its pools (new upstreams warm before they take
    //! traffic; removed ones drain), routes, tenant_latency and default_latency. Other settings
    //! (the tokenizer among them) need a restart.
    void reload();
    //! From an I/O thread: the work (blocking calls to nodes and the store) goes to a worker
    //! thread of its own, so a slow node never holds an I/O thread.
    void handle(api::HttpRequest && req, std::shared_ptr<api::Responder> out);
    size_t in_flight() const { return in_flight_.load(); }

  private:
    void keep_announced();
    //! Checks, authenticates and applies the quotas, then hands the request to its unit.
    void route(api::HttpRequest & req, const std::shared_ptr<api::Responder> & out);
    void readyz(const std::shared_ptr<api::Responder> & out);
    //! Refuses new work of a tenant whose sessions hold its KV quota or more on the nodes (their
    //! load reports in etcd, the same for every gateway).
    std::optional<cluster::QuotaRefusal> kv_held(const Authed & a);
    //! A chat or text completion, or any other request a node answers, with its token quotas.
    void generate_or_relay(api::HttpRequest & req, const std::shared_ptr<api::Responder> & out, const Authed & authed);
    std::string render_metrics();
    //! The routing rules and latency classes as of the last start or SIGHUP.
    std::shared_ptr<const routing::RoutingConfig> routing();

    cluster::ClusterConfig cfg_;
    GatewayOptions o_;
    api::ApiKeys file_keys_;  // until start, when the key directory takes them
    cluster::EtcdClient etcd_;
    GatewayCounters counts_;
    BodyLimits body_limits_;

    // Dependencies, opened by `start`.
    std::unique_ptr<store::ClusterStore> store_;
    std::unique_ptr<cluster::JetStream> js_;
    std::unique_ptr<cluster::RedisPool> redis_;  // null: no Redis
    std::unique_ptr<cluster::Quotas> quotas_;
    std::unique_ptr<PromptCounter> counter_;   // counts prompts for the routing rules (`tokenizer:`)
    std::unique_ptr<routing::PoolSet> pools_;  // GPU pools (`pools:`); null: none
    std::unique_ptr<cluster::EtcdKvStore> kv_;

    // The units.
    std::unique_ptr<ClusterView> view_;
    std::unique_ptr<KeyDirectory> keys_;
    std::unique_ptr<NodeRelay> relay_;
    std::unique_ptr<ChatAffinity> affinity_;
    std::unique_ptr<GenerationRouter> generations_;  // null without pools
    std::unique_ptr<SessionApi> sessions_;
    std::unique_ptr<AdminApi> admin_;
    std::unique_ptr<DashboardFeed> dashboard_;

    std::mutex routing_mu_;
    std::shared_ptr<const routing::RoutingConfig> routing_;  // routing_mu_

    std::string name_, url_;                // in etcd's gateways, under lease_
    int64_t lease_ = 0, announced_ms_ = 0;  // the watcher thread's
    std::atomic<bool> stop_{false};
    std::atomic<size_t> in_flight_{0};
    std::thread watcher_;   // keeps this gateway announced, reloads tenants and keys
    std::thread follower_;  // follows the cluster in etcd
    WorkerPool workers_;    // runs each request (last: it ends first, once its requests have)
};

}  // namespace armada::gateway

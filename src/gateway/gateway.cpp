#include "gateway/gateway.h"

#include "common/clock.h"
#include "common/stop_signals.h"

#include "agent/session_manager.h"
#include "api/auth.h"
#include "api/errors.h"
#include "api/openapi.h"
#include "cluster/cell_brain.h"
#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/membership.h"
#include "cluster/queue.h"
#include "cluster/quota.h"
#include "cluster/redis.h"
#include "cluster/restarter.h"
#include "gateway/checks.h"
#include "gateway/cluster_follower.h"
#include "gateway/dashboard.h"
#include "gateway/pool_request.h"
#include "gateway/pools.h"
#include "gateway/prompt_counter.h"
#include "gateway/routing.h"
#include "gateway/session_lookup.h"
#include "gateway/upstream.h"
#include "gateway/worker_pool.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "store/new_session.h"
#include "store/postgres_store.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <pthread.h>
#include <strings.h>
#include <unistd.h>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

namespace armada::gateway {

namespace {

using json = nlohmann::json;
using api::HttpRequest;
using api::Responder;

const std::vector<std::string> kEndedStates = {"completed", "failed", "cancelled"};

void send_error(const std::shared_ptr<Responder> & out, int status, const std::string & msg, int retry_after = 0,
                const std::string & code = {}) {
    api::Headers h;
    if (retry_after > 0) h.emplace_back("Retry-After", std::to_string(retry_after));
    out->send(status, "application/json", api::error_body(status, msg, {}, code), std::move(h));
}

uint64_t fnv1a(const std::string & s) {
    uint64_t h = 1469598103934665603ULL;
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ULL;
    }
    return h;
}

std::string hex_of(const unsigned char * p, size_t n) {
    static const char * d = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; ++i) {
        s += d[p[i] >> 4];
        s += d[p[i] & 15];
    }
    return s;
}

//! How API keys from PostgreSQL are looked up: their SHA-256, never the key.
std::string sha256_hex(const std::string & s) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_Digest(s.data(), s.size(), md, &n, EVP_sha256(), nullptr);
    return hex_of(md, n);
}

std::string random_hex(size_t bytes) {
    std::vector<unsigned char> b(bytes);
    if (RAND_bytes(b.data(), int(bytes)) != 1) throw std::runtime_error("no randomness for a new key");
    return hex_of(b.data(), bytes);
}

//! The last `"total_tokens":N` in a reply, fed in pieces as it streams (a piece may split it).
class UsageScan {
  public:
    void feed(std::string_view chunk) {
        for (char ch : chunk) {
            if (ch == '\n' && newline_) ++events_;  // an event of a stream ends with a blank line
            newline_ = ch == '\n';
        }
        tail_.append(chunk);
        static const std::string kKey = "\"total_tokens\":";
        for (size_t at = 0; (at = tail_.find(kKey, at)) != std::string::npos; at += kKey.size()) {
            size_t i = at + kKey.size();
            while (i < tail_.size() && tail_[i] == ' ')
                ++i;
            const size_t start = i;
            while (i < tail_.size() && std::isdigit(static_cast<unsigned char>(tail_[i])))
                ++i;
            if (i == tail_.size()) break;  // the number may go on in the next piece
            if (i > start) total_ = std::strtoll(tail_.c_str() + start, nullptr, 10);
        }
        if (tail_.size() > 64) tail_.erase(0, tail_.size() - 64);
    }
    std::optional<int64_t> total() const { return total_; }
    int64_t events() const { return events_; }
    int status = 0;  // of the reply

  private:
    std::string tail_;
    std::optional<int64_t> total_;
    int64_t events_ = 0;
    bool newline_ = false;
};

//! Tenants and their keys as PostgreSQL had them at the last load (a short TTL).
struct Directory {
    std::map<std::string, store::TenantRecord> tenants;  // by name
    std::map<std::string, store::KeyRecord> by_hash;
};

//! Who a request comes from, as the gateway checked it.
struct Authed {
    api::Caller caller;
    const api::ApiKeys::Key * file_key = nullptr;  // --api-key / --api-key-file
    bool from_directory = false;                   // a key from PostgreSQL
    bool acting = false;                           // an admin's X-Armada-Tenant, kept for the nodes
    bool bad_tenant = false;                       // an admin's X-Armada-Tenant that is not t:NAME
    cluster::TenantQuota quota;                    // the tenant's, when PostgreSQL has the tenant
};

constexpr int64_t kDirectoryTtlMs = 2000;
//! How long the gateway follows one etcd watch before it lists the cluster afresh.
constexpr int64_t kRelistMs = 30000;
const char * const kQuotaFields[] = {"requests_per_minute", "tokens_per_minute", "live_sessions", "kv_bytes"};

json tenant_json(const store::TenantRecord & t) {
    return {{"object", "tenant"},
            {"name", t.name},
            {"requests_per_minute", t.rpm},
            {"tokens_per_minute", t.tpm},
            {"live_sessions", t.live_sessions},
            {"kv_bytes", t.kv_bytes},
            {"created_at", t.created_ms / 1000},
            {"updated_at", t.updated_ms / 1000}};
}

json key_json(const store::KeyRecord & k) {
    return {{"object", "api_key"}, {"id", k.id},       {"tenant", k.tenant},
            {"prefix", k.prefix},  {"admin", k.admin}, {"created_at", k.created_ms / 1000}};
}

//! A refusal thrown inside a route and sent by `handle`.
struct ApiErrorReply {
    int status;
    std::string message;
    int retry_after_s;
};

using Reports = std::map<std::string, cluster::CellReport>;

//! The client's responder, passed through, keeping the status it was given (for the request's
//! span). Only first status counts, as in the responder itself.
class StatusTap final : public Responder {
  public:
    //! `seen` is told the status once, when the answer starts (for the gateway's counts).
    explicit StatusTap(std::shared_ptr<Responder> inner, std::function<void(int)> seen = {})
        : inner_(std::move(inner)), seen_(std::move(seen)) {}
    void send(int status, const std::string & content_type, std::string body, api::Headers extra) override {
        note(status);
        inner_->send(status, content_type, std::move(body), std::move(extra));
    }
    void start_stream(int status, api::Headers extra) override {
        note(status);
        inner_->start_stream(status, std::move(extra));
    }
    void write(std::string chunk) override { inner_->write(std::move(chunk)); }
    void end() override { inner_->end(); }
    bool closed() const override { return inner_->closed(); }
    void on_close(std::function<void()> fn) override { inner_->on_close(std::move(fn)); }
    void long_lived() override { inner_->long_lived(); }
    // (Every request passes through a tap: what the responder itself does is passed on whole.)
    size_t backlog() const override { return inner_->backlog(); }
    void abort() override { inner_->abort(); }
    int status() const { return status_.load(); }

  private:
    void note(int status) {
        int none = 0;
        if (status_.compare_exchange_strong(none, status) && seen_) seen_(status);
    }
    std::shared_ptr<Responder> inner_;
    std::function<void(int)> seen_;
    std::atomic<int> status_{0};
};

class Gateway {
  public:
    Gateway(cluster::ClusterConfig cfg, GatewayOptions o, api::ApiKeys keys)
        : cfg_(std::move(cfg)),
          o_(std::move(o)),
          keys_(std::move(keys)),
          etcd_(cluster::make_etcd(cfg_)),
          workers_(std::chrono::seconds(30), o_.max_workers) {
        // The key requests with keys from PostgreSQL are forwarded under: the nodes know it.
        forward_key_ = o_.api_key;
        for (const auto & k : keys_.keys()) {
            if (forward_key_.empty() && k.admin) forward_key_ = k.key;
        }
    }

    std::string start() {
        std::string err;
        // Nodes (and pools) over HTTPS are checked against the cluster's CA too.
        if (cfg_.nodes_auth.tls()) {
            auto tls = cluster::service_tls(cfg_.nodes_auth, "credentials.nodes", err);
            if (!tls) return err;
            set_upstream_tls(std::move(tls));
        }
        store::PostgresConfig pc;
        pc.urls = cfg_.postgres;
        pc.read_connections = cfg_.pg_pool;
        store_ = store::PostgresStore::open(pc, err);
        if (!store_) return "PostgreSQL: " + err;
        js_ = cluster::JetStream::connect(cfg_.nats, err, cfg_.nats_auth);
        if (!js_) return "NATS at " + cfg_.nats + ": " + err;
        if (!cfg_.redis.empty()) {
            redis_ = cluster::RedisPool::open(cfg_.redis, cfg_.redis_pool, 500, err, cfg_.redis_auth);
            if (!redis_) return "Redis: " + err;
        }
        if (!cfg_.routing.tokenizer.empty()) {
            counter_ = PromptCounter::load(cfg_.routing.tokenizer, err);
            if (!counter_) return "tokenizer: " + err;
        }
        routing_ = std::make_shared<cluster::RoutingConfig>(cfg_.routing);
        if (!cfg_.routing.pools.empty()) {
            pools_ = PoolSet::open(cfg_.routing.pools, err);
            if (!pools_) return err;
            pools_->start();
        }
        quotas_ = std::make_unique<cluster::Quotas>(redis_.get(), [this] { return live_gateways_.load(); });
        if (!load_directory())
            spdlog::warn("gateway: cannot read tenants and keys from PostgreSQL yet; retrying every {} ms",
                         kDirectoryTtlMs);
        // The cluster as etcd shows it now, before the first request.
        kv_ = std::make_unique<cluster::EtcdKvStore>(etcd_);
        follower_view_ = std::make_unique<ClusterFollower>(*kv_, cfg_.prefix, cluster::real_clock(), kRelistMs);
        follow_round(0);
        return {};
    }
    //! Joins the live gateways in etcd as `name` (at `url`) and starts following the cluster.
    void announce(const std::string & name, const std::string & url) {
        {
            std::lock_guard lk(mu_);  // the dashboard reads it
            name_ = name;
        }
        url_ = url;
        keep_announced();
        follower_ = std::thread([this] { follow(); });
        dasher_ = std::thread([this] { feed_dashboards(); });
        watcher_ = std::thread([this] {
            while (!stop_.load()) {
                std::this_thread::sleep_for(std::chrono::milliseconds(250));
                keep_announced();
                if (common::steady_ms() - directory_ms_ >= kDirectoryTtlMs) load_directory();
            }
        });
    }
    void stop() {
        stop_ = true;
        if (watcher_.joinable()) watcher_.join();
        if (follower_.joinable()) follower_.join();
        if (dasher_.joinable()) dasher_.join();
        if (lease_ != 0) etcd_.revoke(lease_);  // the others' share of each quota grows at once
        if (pools_) pools_->stop();
    }
    //! SIGHUP: the cluster file read again for its pools (new upstreams warm before they take
    //! traffic; removed ones drain), routes, tenant_latency and default_latency. Other settings
    //! (the tokenizer among them) need a restart.
    void reload() {
        std::string err;
        auto cfg = cluster::load_cluster_config_for_service(o_.cluster_file, err);
        if (!cfg) {
            spdlog::error("gateway: reload: {}; keeping the pools as they were", err);
            return;
        }
        if (!pools_) {
            spdlog::warn("gateway: reload: this gateway started without pools; pools need a restart");
            return;
        }
        const bool counts = std::any_of(cfg->routing.routes.begin(), cfg->routing.routes.end(),
                                        [](const auto & r) { return r.prompt_tokens_over.has_value(); });
        if (counts && !counter_) {
            spdlog::error(
                "gateway: reload: a rule routes by prompt tokens but this gateway started without a "
                "tokenizer; keeping the pools and routes as they were");
            return;
        }
        if (cfg->routing.tokenizer != cfg_.routing.tokenizer) {
            spdlog::warn("gateway: reload: tokenizer changed; it is read at start only");
        }
        if (auto e = pools_->reload(cfg->routing.pools); !e.empty()) {
            spdlog::error("gateway: reload: {}; keeping the pools as they were", e);
            return;
        }
        {
            auto rc = std::make_shared<cluster::RoutingConfig>(cfg->routing);
            rc->tokenizer = cfg_.routing.tokenizer;
            std::lock_guard lk(mu_);
            routing_ = std::move(rc);
        }
        spdlog::info("gateway: reload: {} pools, {} routes", cfg->routing.pools.size(), cfg->routing.routes.size());
    }
    size_t in_flight() const { return in_flight_.load(); }

    //! From an I/O thread: the work (blocking calls to nodes and the store) goes to a worker
    //! thread of its own, so a slow node never holds an I/O thread.
    void handle(HttpRequest && req, std::shared_ptr<Responder> out) {
        ++in_flight_;
        auto client = out;
        try {
            workers_.post([this, req = std::move(req), out = std::move(out)]() mutable {
                // The gateway hop of a trace: a server span, the parent of whatever the request
                // causes further on (the node's spans, the brain's `place`). Without a tracer
                // the client's own context passes through untouched.
                const auto tracer = obs::tracer();
                std::optional<obs::Span> span;
                // The status, for the span and the counts of answers by class.
                auto tap = std::make_shared<StatusTap>(out, [this](int status) { count_status(status); });
                out = tap;
                if (tracer->enabled()) {
                    const std::string route_name = http_route(req.path);
                    span = obs::Span::start(req.method + " " + route_name, obs::SpanKind::server,
                                            obs::TraceContext::parse(req.header("traceparent")));
                    span->set("http.request.method", req.method);
                    span->set("http.route", route_name);
                    span->set("url.path", req.path);
                    req.headers["traceparent"] = span->context().traceparent();
                }
                // Log lines about this request carry its trace (and its session, for session routes).
                std::string session;
                if (req.path.rfind("/v1/sessions/", 0) == 0) {
                    const size_t end = req.path.find('/', 13);
                    session = req.path.substr(13, end == std::string::npos ? std::string::npos : end - 13);
                }
                const obs::LogScope log_scope(session, span ? std::optional(span->context())
                                                            : obs::TraceContext::parse(req.header("traceparent")));
                struct EndSpan {
                    std::optional<obs::Span> & s;
                    const std::shared_ptr<StatusTap> & tap;
                    const std::shared_ptr<obs::Tracer> & t;
                    ~EndSpan() {
                        if (!s) return;
                        s->http_status(tap->status());
                        t->end(std::move(*s));
                    }
                } end_span{span, tap, tracer};
                try {
                    route(req, out);
                } catch (const ApiErrorReply & e) {
                    send_error(out, e.status, e.message, e.retry_after_s);
                } catch (const std::exception & e) {
                    spdlog::error("gateway: {} {}: {}", req.method, req.path, e.what());
                    send_error(out, 500, "the gateway failed on this request");
                } catch (...) {
                    send_error(out, 500, "the gateway failed on this request");
                }
                --in_flight_;
            });
        } catch (const WorkerPool::Full &) {
            --in_flight_;
            ++refused_workers_;
            count_status(503);
            send_error(client, 503, "the gateway is at its limit of requests in progress; retry shortly", 1,
                       "overloaded");
        } catch (const std::exception & e) {
            // No thread could be started (the process is at its limit): the client hears so.
            --in_flight_;
            spdlog::error("gateway: no worker thread for a request: {}", e.what());
            count_status(503);
            send_error(client, 503, "the gateway is overloaded; retry shortly", 1, "overloaded");
        }
    }

  private:
    // ---- this gateway among the others ----
    void keep_announced() {
        const int64_t t = common::steady_ms();
        if (t - announced_ms_ < 1000) return;
        announced_ms_ = t;
        if (lease_ != 0) {
            int64_t ttl = 0;
            if (etcd_.keepalive(lease_, ttl).empty() && ttl > 0) return;
            lease_ = 0;
        }
        int64_t lease = 0;
        if (!etcd_.grant(cfg_.lease_ttl_s, lease).empty()) return;
        if (!etcd_.put(cluster::gateways_prefix(cfg_) + name_, url_, lease).empty()) return;
        lease_ = lease;
    }

    // ---- tenants and keys (PostgreSQL, cached) ----
    bool load_directory() {
        directory_ms_ = common::steady_ms();
        auto tenants = store_->tenants();
        auto keys = tenants ? store_->keys() : std::nullopt;
        if (!tenants || !keys) {
            if (!directory_warned_)
                spdlog::warn("gateway: cannot read tenants and keys from PostgreSQL; using the last ones read");
            directory_warned_ = true;
            return false;
        }
        directory_warned_ = false;
        auto d = std::make_shared<Directory>();
        for (auto & t : *tenants)
            d->tenants[t.name] = std::move(t);
        for (auto & k : *keys)
            d->by_hash[k.hash] = std::move(k);
        std::lock_guard lk(mu_);
        directory_ = std::move(d);
        return true;
    }
    std::shared_ptr<const Directory> directory() {
        std::lock_guard lk(mu_);
        return directory_;
    }
    //! The caller of `req`, or nullopt when authentication is on and its key is unknown.
    std::optional<Authed> authenticate(const HttpRequest & req) {
        auto dir = directory();
        Authed a;
        const std::string auth = req.header("authorization"), xkey = req.header("x-api-key");
        if (keys_.enabled()) a.file_key = keys_.check(auth, xkey);
        if (a.file_key) {
            a.caller = keys_.caller(a.file_key);
            // An admin acting as a tenant is that tenant here too (owner, quotas), as on a node.
            if (const std::string as = req.header("x-armada-tenant"); a.caller.admin && !as.empty()) {
                auto acting = api::acting_as(as);
                if (!acting) {
                    a.bad_tenant = true;
                    return a;
                }
                a.caller = std::move(*acting);
                a.acting = true;
            }
        } else if (dir && !dir->by_hash.empty()) {
            const std::string presented = api::presented_key(auth, xkey);
            auto it = presented.empty() ? dir->by_hash.end() : dir->by_hash.find(sha256_hex(presented));
            if (it == dir->by_hash.end()) return std::nullopt;
            a.caller.tenant = api::tenant_id(it->second.tenant);
            a.caller.tenant_name = it->second.tenant;
            a.caller.account = it->second.id;
            a.caller.admin = it->second.admin;
            a.from_directory = true;
        } else if (keys_.enabled()) {
            return std::nullopt;
        } else {
            a.caller = keys_.caller(nullptr);
        }
        // The tenant's quotas, whichever key it came with.
        if (dir && a.caller.tenant.rfind("t:", 0) == 0) {
            if (auto it = dir->tenants.find(a.caller.tenant_name); it != dir->tenants.end())
                a.quota = {it->second.rpm, it->second.tpm, it->second.live_sessions, it->second.kv_bytes};
        }
        return a;
    }
    //! What the nodes see: a key from PostgreSQL is not theirs, so the gateway forwards under its
    //! own (admin) key, acting as the tenant. Only an admin may name a tenant itself.
    void rewrite_identity(HttpRequest & req, const Authed & a) {
        if (!a.acting) req.headers.erase("x-armada-tenant");
        if (!a.from_directory) return;
        req.headers.erase("x-api-key");
        req.headers.erase("authorization");
        if (!forward_key_.empty()) req.headers["authorization"] = "Bearer " + forward_key_;
        req.headers["x-armada-tenant"] = a.caller.tenant;
    }

    void refuse(const std::shared_ptr<Responder> & out, const api::Caller & caller, const cluster::QuotaRefusal & r) {
        {
            std::lock_guard lk(mu_);
            refused_[r.quota]++;
        }
        const std::string who =
            caller.tenant_name.empty() ? std::string("this key") : "tenant '" + caller.tenant_name + "'";
        api::Headers h{{"Retry-After", std::to_string(r.retry_after_s)}};
        out->send(429, "application/json",
                  api::error_body(429,
                                  who + " is over its " + r.quota + " quota (" + std::to_string(r.limit) +
                                      "); retry after " + std::to_string(r.retry_after_s) + " s",
                                  r.quota, "quota_exceeded"),
                  std::move(h));
    }

    // ---- the cluster as etcd shows it ----
    //! One round of the cluster follower (gateway/cluster_follower.h): what changed is decoded on
    //! this thread, and the routing lock is held only to store it. A fresh list replaces the view
    //! (etcd's word on every node is fresh then). -1 when the next round may start now; else how
    //! long to pause before it (the cells could not be read).
    int64_t follow_round(int wait_ms) {
        ClusterFollower::Round r = follower_view_->poll(wait_ms);
        if (!r.ok && !r.list_failed) spdlog::debug("gateway: {}", r.error);  // a watch that ended: listed again
        if (r.list_failed && !etcd_warned_)
            spdlog::warn("gateway: cannot list the cluster in etcd: {} (keeping the last view)", r.error);
        if (r.list_failed || r.ok) etcd_warned_ = r.list_failed;
        if (r.rebuilt) {
            gateways_ = std::move(r.view.gateways);
            live_gateways_ = std::max(1, int(gateways_.size()));
            std::lock_guard lk(mu_);
            nodes_ = std::move(r.view.nodes);
            unreachable_.clear();
            reports_ = std::move(r.view.reports);
            rollout_ = std::move(r.view.rollout);
            if (r.view.shares) shares_ = std::move(*r.view.shares);  // kept when deleted: no brain leads now
        } else if (!r.changes.empty()) {
            using Kind = cluster::ClusterKeys::Parsed::Kind;
            for (const auto & c : r.changes) {
                if (c.key.kind != Kind::Gateway) continue;
                // The live gateways (this one included): each one's share of a quota without Redis.
                if (c.put)
                    gateways_.insert(c.raw);
                else
                    gateways_.erase(c.raw);
            }
            live_gateways_ = std::max(1, int(gateways_.size()));
            std::lock_guard lk(mu_);
            for (auto & c : r.changes) {
                switch (c.key.kind) {
                    case Kind::Node:
                        if (c.node)
                            nodes_[c.key.name] = std::move(*c.node);
                        else
                            nodes_.erase(c.key.name);
                        // What became of a node a connect failed to: back, or gone.
                        unreachable_.erase(c.key.name);
                        break;
                    case Kind::CellReport:
                        if (c.report)
                            reports_[c.key.cell] = std::move(*c.report);
                        else
                            reports_.erase(c.key.cell);
                        break;
                    case Kind::Shares:
                        if (c.shares) shares_ = std::move(*c.shares);  // kept when deleted
                        break;
                    case Kind::RolloutState:
                        rollout_ = std::move(c.rollout);  // the rollout's progress, for the dashboard
                        break;
                    default:
                        break;
                }
            }
        }
        return r.retry_in_ms > 0 ? r.retry_in_ms : -1;
    }
    //! Follows the cluster until the gateway stops: a list, then watches from the revision after
    //! it, each change applied as it comes; when a watch breaks (etcd restarted, compacted), a
    //! list again after a jittered back-off, and every kRelistMs in any case (a watch over a
    //! connection that died without a word would keep an old view).
    void follow() {
        while (!stop_.load()) {
            const int64_t retry_ms = follow_round(200);
            if (retry_ms < 0) continue;
            // Not before the back-off, and a stop still ends the wait soon.
            const int64_t until = common::steady_ms() + std::max<int64_t>(50, retry_ms);
            while (!stop_.load() && common::steady_ms() < until)
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
    //! A node etcd holds a key for (one a connect failed to included).
    std::optional<NodeView> node(const std::string & name) {
        std::lock_guard lk(mu_);
        auto it = nodes_.find(name);
        if (it != nodes_.end()) return it->second;
        if (auto u = unreachable_.find(name); u != unreachable_.end()) return u->second;
        return std::nullopt;
    }
    //! The live, non-draining node with the most room (round-robin among equals), or none.
    std::optional<std::string> by_load(const std::string & cell = {}, const std::set<std::string> & avoid = {}) {
        std::lock_guard lk(mu_);
        const auto best = most_room(nodes_, cell, avoid);
        if (best.empty()) return std::nullopt;
        return best[rr_++ % best.size()];
    }
    //! The cell for a new session of `tenant`: --cell, else the global brain's split (the tenant's
    //! home cell first) over the cells with a live node, else the cell under its water level whose
    //! nodes report the most room. "" when every cell that takes work is at its water level (the
    //! split marks it full): the room above the water is the reserve that takes in a lost cell's
    //! sessions, so new ones wait (503 and Retry-After) rather than eat it.
    std::string pick_cell(const std::string & tenant) {
        if (!o_.cell.empty()) return o_.cell;
        std::lock_guard lk(mu_);
        std::map<std::string, int64_t> room;  // cells with a live node that takes work
        for (const auto & [name, v] : nodes_) {
            if (!v.load.draining) room[v.cell] += v.load.free_seqs;
        }
        // The split may be older than the last node of a cell: a cell with none takes nothing.
        cluster::Shares live = shares_;
        std::erase_if(live.weight, [&](const auto & w) { return !room.count(w.first); });
        if (std::string c = cluster::pick_cell(live, tenant); !c.empty()) return c;
        if (room.empty()) return "cell0";  // no node known yet: the session waits in cell0's queue
        std::string best;
        int64_t most = -1;
        for (const auto & [c, r] : room) {
            if (!shares_.full.count(c) && r > most) {
                best = c;
                most = r;
            }
        }
        return best;
    }

    // ---- forwarding ----
    //! Where `relay_to` sends a request, and how.
    struct RelayTarget {
        std::string base;  // http://host:port
        HeaderList headers;
        const std::string * body = nullptr;
        int timeout_ms = 600000;
        api::Headers extra;        // added to the reply the client gets
        bool may_resend = false;   // no side effect: sent and not answered, it may go elsewhere
        bool hold_errors = false;  // a 429 or 5xx answer is not passed on: the caller tries elsewhere
        int idle_ms = 0;           // a stream quiet for this long is cut (0: no limit)
        bool scrub = false;        // a pool's answer: cached-token counts and timings removed
    };
    struct Relayed {
        bool delivered = false;  // the client has its answer (or its stream ended)
        int status = 0;          // what the upstream said (0: nothing)
        double head_s = 0;       // how long its head took
        bool client_gone = false;
        bool cut = false;  // a stream that ended with an error (the upstream went away mid-way)
        //! The request was written to the upstream: it is up and taking connections, even if it
        //! then said nothing (hung). Only one that could not be reached is forgotten.
        bool reached = false;
    };
    //! Forwards `req` to `t` and answers the client with what it said (streamed when it streams).
    Relayed relay_to(const RelayTarget & t, const HttpRequest & req, const std::shared_ptr<Responder> & out,
                     UsageScan * usage = nullptr) {
        Relayed res;
        bool streaming = false;
        PoolStreamScrubber scrubber;
        auto cancel = std::make_shared<CancelToken>();
        out->on_close([cancel] { cancel->cancel(); });
        const auto t0 = std::chrono::steady_clock::now();
        auto r = forward(
            t.base, req.method, target_of(req), t.headers, *t.body, t.timeout_ms,
            [&](const UpstreamReply & head) {
                res.head_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                for (const auto & [k, val] : head.headers) {
                    if (k.size() == 12 && strcasecmp(k.c_str(), "content-type") == 0 &&
                        val.rfind("text/event-stream", 0) == 0)
                        streaming = true;
                }
                if (streaming) {
                    api::Headers h = t.extra;
                    for (const auto & [k, val] : head.headers) {
                        if (strcasecmp(k.c_str(), "content-type") != 0) h.emplace_back(k, val);
                    }
                    out->start_stream(head.status, std::move(h));
                }
                return streaming;
            },
            [&](std::string_view chunk) {
                if (out->closed()) return false;
                if (usage) usage->feed(chunk);
                if (t.scrub) {
                    if (std::string s = scrubber.feed(chunk); !s.empty()) out->write(std::move(s));
                } else {
                    out->write(std::string(chunk));
                }
                return true;
            },
            cancel, t.idle_ms);
        if (streaming && t.scrub && !out->closed()) {
            if (std::string s = scrubber.flush(); !s.empty()) out->write(std::move(s));
        }
        if (!streaming) res.head_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r.invalid) {
            // Checked before routing, so this is a last guard: nothing went to the upstream.
            send_error(out, 400, "the request holds bytes the gateway does not pass on: " + r.error);
            res.delivered = true;
            return res;
        }
        res.status = r.status;
        res.reached = r.sent;
        res.client_gone = cancel->cancelled() || out->closed();
        if (usage) usage->status = r.status != 0 ? r.status : (streaming ? 200 : 0);
        if (r.status == 0) {
            if (streaming) {
                out->end();  // the upstream went away mid-stream: the client sees the stream end
                res.delivered = true;
                return res;
            }
            if (res.client_gone) {
                res.delivered = true;  // nobody to answer, and nothing to send elsewhere
                return res;
            }
            spdlog::warn("gateway: {} did not answer {} {}: {}", t.base, req.method, req.path, r.error);
            if (r.sent && req.method != "GET" && !t.may_resend) {
                // It may have acted on it: sending it to another node could do it twice.
                send_error(out, 502,
                           "the node did not answer; the request may or may not have taken effect (check before "
                           "retrying)",
                           0, "upstream_failed");
                res.delivered = true;
            }
            return res;
        }
        if (r.streamed) {
            out->end();
            res.delivered = true;
            res.cut = !r.error.empty() && !res.client_gone;
            return res;
        }
        // Held: busy (429), failed (5xx), or refusing the upstream's own key or model name
        // (401, 403, 404: a fault of the pool's settings, not of the client's request).
        if (t.hold_errors &&
            (r.status == 429 || r.status >= 500 || r.status == 401 || r.status == 403 || r.status == 404))
            return res;
        std::string ctype = "application/json";
        api::Headers h = t.extra;
        for (const auto & [k, val] : r.headers) {
            if (strcasecmp(k.c_str(), "content-type") == 0)
                ctype = val;
            else
                h.emplace_back(k, val);
        }
        if (usage) usage->feed(r.body);
        if (t.scrub) r.body = scrub_pool_json(r.body);
        out->send(r.status, ctype, std::move(r.body), std::move(h));
        res.delivered = true;
        return res;
    }
    //! Forwards to node `node_name` (see relay_to); false when it could not be reached and
    //! nothing was sent to the client.
    Relayed relay(const std::string & node_name, const HttpRequest & req, const std::shared_ptr<Responder> & out,
                  UsageScan * usage = nullptr, int timeout_ms = 600000, const api::Headers & extra = {}) {
        auto v = node(node_name);
        if (!v) return {};
        RelayTarget t;
        t.base = v->load.url;
        t.headers = pass_headers(req);
        t.body = &req.body;
        t.timeout_ms = timeout_ms;
        t.extra = extra;
        return relay_to(t, req, out, usage);
    }
    //! Forwards to the node with the most room, then to another if it does not answer.
    void relay_by_load(const HttpRequest & req, const std::shared_ptr<Responder> & out,
                       std::optional<std::string> first = std::nullopt, UsageScan * usage = nullptr,
                       const api::Headers & extra = {}) {
        std::set<std::string> tried;  // a third attempt must not go back to a node that failed
        for (int attempt = 0; attempt < 3; ++attempt) {
            auto n = attempt == 0 && first ? first : by_load({}, tried);
            if (!n) break;
            const Relayed r = relay(*n, req, out, usage, 600000, extra);
            if (r.delivered) return;
            tried.insert(*n);
            // A node that took the request and said nothing may be hung, not gone: it keeps its
            // sessions (forgetting it would route them around a live holder).
            if (!r.reached) forget(*n);
        }
        send_error(out, 503, "no node of the cluster is ready to take this request; retry shortly", 2, "no_node");
    }
    //! A connect to `name` failed: no new work goes to it until etcd speaks of it again. It
    //! still holds its sessions (holder) while its key lives: only etcd says a node is gone.
    void forget(const std::string & name) {
        std::lock_guard lk(mu_);
        if (auto it = nodes_.find(name); it != nodes_.end()) {
            unreachable_[name] = it->second;
            nodes_.erase(it);
        }
    }

    // ---- routes ----
    void route(HttpRequest & req, const std::shared_ptr<Responder> & out) {
        // Every byte that may go on to a node or a pool is checked first: the target, headers,
        // ids, the query values that become headers, and the body's shape (before anything
        // parses or builds it).
        if (auto bad = check_request(req, body_limits_)) return send_error(out, bad->status, bad->reason);
        const std::string & p = req.path;
        if (p == "/health" || p == "/livez") {
            out->send(200, "application/json", R"({"status":"ok"})");
            return;
        }
        if (p == "/openapi.json") {
            if (req.method != "GET") return send_error(out, 405, "use GET for /openapi.json");
            return out->send(200, "application/json", std::string(api::openapi_document()));
        }
        if (p == "/readyz") {
            size_t n = 0;
            std::map<std::string, double> weights;  // the split it follows (tenant homes stay private)
            std::set<std::string> full;
            {
                std::lock_guard lk(mu_);
                n = nodes_.size();
                weights = shares_.weight;
                full = shares_.full;
            }
            if (n == 0)
                send_error(out, 503, "no node has joined the cluster yet");
            else {
                json r{{"status", "ready"}, {"nodes", n}, {"cell_weights", weights}, {"full_cells", full}};
                if (pools_) r["pools"] = pools_->status(false);
                out->send(200, "application/json", r.dump());
            }
            return;
        }
        // A browser opens the dashboard with HTTP Basic credentials (the password is the API key):
        // they come with its event stream too, which cannot carry a header of its own.
        const bool dashboard = p == "/dashboard" || p.rfind("/dashboard/", 0) == 0;
        if (dashboard) basic_as_bearer(req);
        if (!keys_.enabled() && !directory()) {
            // Without keys of its own, whether callers need one depends on PostgreSQL's.
            send_error(out, 503, "the gateway has not read its tenants and keys from PostgreSQL yet; retry shortly", 2,
                       "store_unavailable");
            return;
        }
        auto authed = authenticate(req);
        if (authed && authed->bad_tenant) {
            send_error(
                out, 400,
                "X-Armada-Tenant must be 't:NAME' with a tenant name of 1 to 64 letters, digits, '_', '-' or '.'");
            return;
        }
        if (!authed) {
            if (dashboard) {
                out->send(401, "application/json",
                          api::error_body(401,
                                          "the dashboard needs an admin key: as the password of HTTP Basic, or "
                                          "'Authorization: Bearer <key>'",
                                          {}, "invalid_api_key"),
                          {{"WWW-Authenticate", "Basic realm=\"Armada dashboard\", charset=\"UTF-8\""}});
                return;
            }
            send_error(out, 401, "missing or invalid API key; send 'Authorization: Bearer <key>'", 0,
                       "invalid_api_key");
            return;
        }
        const api::Caller & caller = authed->caller;
        if (p == "/metrics") {
            if (!caller.admin) return send_error(out, 403, "/metrics needs an admin key");
            out->send(200, "text/plain; version=0.0.4", render_metrics());
            return;
        }
        if (dashboard) return dashboard_route(req, out, caller);
        const auto parts = split_path(p);
        if (!parts.empty() && parts[0] == "admin") return admin(req, out, caller, parts);
        rewrite_identity(req, *authed);
        // As on a node: requests that start work count, reads (GET, event streams) and deletes do not.
        if (req.method == "POST") {
            // The tenant's quotas (PostgreSQL), then a key's own (--api-key-file), all shared.
            if (auto r = kv_held(*authed)) return refuse(out, caller, *r);
            if (auto r = quotas_->request(caller.tenant, authed->quota.rpm)) return refuse(out, caller, *r);
            const auto * key = authed->file_key;
            if (key && key->limits && key->limits->requests_per_min > 0) {
                if (auto r = quotas_->request(caller.tenant + ":acct:" + caller.account,
                                              int64_t(key->limits->requests_per_min)))
                    return refuse(out, caller, *r);
            }
        } else if (!caller.admin && o_.reads_per_minute > 0) {
            // Reads start no work, but each holds a worker and reaches a node or the store: a key
            // has a budget of its own for them.
            if (auto r = quotas_->request(caller.tenant + ":reads:" + caller.account, o_.reads_per_minute)) {
                r->quota = "reads_per_minute";
                return refuse(out, caller, *r);
            }
        }
        ++requests_;
        if (parts.size() == 4 && parts[0] == "v1" && parts[1] == "agents" && parts[3] == "sessions" &&
            req.method == "POST")
            return create_session(req, out, *authed, parts[2]);
        if (parts.size() >= 3 && parts[0] == "v1" && parts[1] == "sessions")
            return session_route(req, out, caller, parts[2], parts.size() == 4 ? parts[3] : std::string());
        const bool generates =
            req.method == "POST" && (p == "/v1/chat/completions" || p == "/v1/completions" || p == "/v1/responses");
        Tokens tokens;
        if (generates && authed->quota.tpm > 0) {
            int64_t prompt = 0;
            const int64_t estimate = estimate_tokens(req.body, prompt);
            if (auto r = quotas_->reserve_tokens(caller.tenant, authed->quota.tpm, estimate, tokens.hold))
                return refuse(out, caller, *r);
            tokens.tenant = caller.tenant;
            tokens.prompt = prompt;
        }
        // A key's own tokens per minute (--api-key-file tpm=): a node counts what it serves, but
        // a pool's tokens pass no node, so the gateways count them too, shared as the rpm is.
        Tokens key_tokens;
        if (const auto * key = authed->file_key;
            generates && pools_ && key && key->limits && key->limits->tokens_per_min > 0) {
            int64_t prompt = 0;
            const int64_t estimate = estimate_tokens(req.body, prompt);
            const std::string bucket = caller.tenant + ":acct:" + caller.account;
            if (auto r =
                    quotas_->reserve_tokens(bucket, int64_t(key->limits->tokens_per_min), estimate, key_tokens.hold)) {
                if (!tokens.tenant.empty()) quotas_->settle_tokens(tokens.tenant, tokens.hold, 0);
                return refuse(out, caller, *r);
            }
            key_tokens.tenant = bucket;
            key_tokens.prompt = prompt;
        }
        if (pools_ && req.method == "POST" && (p == "/v1/chat/completions" || p == "/v1/completions"))
            route_generation(req, out, caller, &tokens.scan);
        else if (p == "/v1/chat/completions" && req.method == "POST")
            relay_by_load(req, out, affinity(req, caller), &tokens.scan);
        else
            relay_by_load(req, out, std::nullopt, &tokens.scan);
        // Settled with what the reply said it used; a stream that does not say is counted an
        // event a token; a refusal used none.
        for (const Tokens * t : {&tokens, &key_tokens}) {
            if (t->tenant.empty()) continue;
            const UsageScan & s = tokens.scan;
            const int64_t used = s.status == 0 || s.status >= 400 ? 0
                                 : s.total()                      ? *s.total()
                                 : s.events() > 0                 ? t->prompt + s.events()
                                                                  : t->hold.estimate;
            quotas_->settle_tokens(t->tenant, t->hold, used);
        }
    }

    // ---- the dashboard ----
    //! `Authorization: Basic base64(user:key)` as `Bearer key` (any user name).
    static void basic_as_bearer(HttpRequest & req) {
        const std::string a = req.header("authorization");
        if (a.size() < 6 || strncasecmp(a.c_str(), "basic ", 6) != 0) return;
        size_t b = 6;
        while (b < a.size() && a[b] == ' ')
            ++b;
        const auto decoded = cluster::EtcdClient::unbase64(a.substr(b));
        // Not Basic after all, or bytes no header may hold: refused as an unknown key.
        if (!decoded || !header_value_ok(*decoded)) return;
        const size_t colon = decoded->find(':');
        req.headers["authorization"] = "Bearer " + (colon == std::string::npos ? *decoded : decoded->substr(colon + 1));
    }
    static api::Headers page_headers() {
        return {{"Cache-Control", "no-store"},
                {"X-Content-Type-Options", "nosniff"},
                {"Referrer-Policy", "no-referrer"},
                {"X-Frame-Options", "DENY"},
                {"Content-Security-Policy",
                 "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
                 "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"}};
    }
    void dashboard_route(const HttpRequest & req, const std::shared_ptr<Responder> & out, const api::Caller & caller) {
        if (!caller.admin) return send_error(out, 403, "the dashboard needs an admin key", 0, "permission_denied");
        const std::string & p = req.path;
        if (req.method != "GET") return send_error(out, 405, "the dashboard takes GET only");
        if (p == "/dashboard" || p == "/dashboard/")
            return out->send(200, "text/html; charset=utf-8", std::string(dashboard_html()), page_headers());
        if (p == "/dashboard/app.js")
            return out->send(200, "text/javascript; charset=utf-8", std::string(dashboard_js()), page_headers());
        if (p == "/dashboard/snapshot") return out->send(200, "application/json", dump(snapshot()), page_headers());
        if (p == "/dashboard/events") {
            const std::string first = sse_snapshot();
            std::lock_guard lk(dash_mu_);
            if (dashboards_.size() >= kMaxDashboards)
                return send_error(out, 503,
                                  "this gateway already feeds " + std::to_string(kMaxDashboards) +
                                      " dashboards; close one or open another gateway's",
                                  5, "overloaded");
            out->start_stream(200, {{"Cache-Control", "no-store"}, {"X-Accel-Buffering", "no"}});
            out->long_lived();
            out->write("retry: 2000\n\n" + first);
            dashboards_.push_back(out);
            return;
        }
        send_error(out, 404,
                   "no dashboard route " + p +
                       "; there are /dashboard (the page), /dashboard/events (its SSE stream) and /dashboard/snapshot "
                       "(one snapshot as JSON)",
                   0, "not_found");
    }
    //! The cluster as this gateway sees it now (see dashboard_snapshot).
    json snapshot() {
        DashboardView v;
        v.at_ms = common::wall_ms();
        v.gateways = live_gateways_.load();
        v.etcd_ok = !etcd_warned_.load();
        {
            std::lock_guard lk(mu_);
            v.gateway = name_;
            v.nodes = nodes_;
            v.reports = reports_;
            v.shares = shares_;
            v.rollout = rollout_;
        }
        return dashboard_snapshot(v);
    }
    //! Names come from etcd's keys: bytes that are not UTF-8 are replaced, never thrown on.
    static std::string dump(const json & j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
    std::string sse_snapshot() { return "event: snapshot\ndata: " + dump(snapshot()) + "\n\n"; }
    //! Each second, one snapshot to every open dashboard (made once for all of them); the ones
    //! whose browser went away are dropped.
    void feed_dashboards() {
        while (!stop_.load()) {
            for (int i = 0; i < 20 && !stop_.load(); ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            {
                std::lock_guard lk(dash_mu_);
                std::erase_if(dashboards_, [](const auto & o) { return o->closed(); });
                if (dashboards_.empty()) continue;
            }
            try {
                const std::string event = sse_snapshot();
                std::lock_guard lk(dash_mu_);
                for (const auto & o : dashboards_)
                    o->write(event);
            } catch (const std::exception & e) {
                spdlog::error("gateway: dashboard snapshot: {}", e.what());
            }
        }
    }

    // ---- GPU pools ----
    //! Tokens one sequence of the CPU nodes holds (the largest any live node reports; 0: none says).
    int64_t cpu_context() {
        std::lock_guard lk(mu_);
        int64_t best = 0;
        for (const auto & [name, v] : nodes_) {
            if (!v.load.draining) best = std::max(best, v.load.ctx);
        }
        return best;
    }
    void count_route(const std::string & target, const std::string & rule) {
        std::lock_guard lk(mu_);
        ++routed_[{target, rule}];
    }
    //! A chat or text completion when the cluster has pools: the routing rules pick `cpu` or a
    //! pool from what the request is (its prompt's tokens, counted with the model's tokenizer; its
    //! max_tokens; its latency class; its model). A pool that is down, full or failing sends it
    //! to the CPU nodes when it fits there, saying so in X-Armada-Route.
    void route_generation(const HttpRequest & req, const std::shared_ptr<Responder> & out, const api::Caller & caller,
                          UsageScan * usage) {
        const bool chat = req.path == "/v1/chat/completions";
        const json body = json::parse(req.body, nullptr, false);
        const auto rcp = routing();
        const auto & rc = *rcp;
        const int64_t cpu_ctx = cpu_context();
        // The count matters only up to the smallest number a decision compares it with: a
        // rule's threshold, or a target's context.
        int64_t enough = std::numeric_limits<int64_t>::max();
        for (const auto & r : rc.routes) {
            if (r.prompt_tokens_over) enough = std::min(enough, *r.prompt_tokens_over);
        }
        if (cpu_ctx > 0) enough = std::min(enough, cpu_ctx - 1);
        for (const auto & name : pools_->names()) {
            if (const int64_t c = pools_->context(name); c > 0) enough = std::min(enough, c - 1);
        }
        cluster::RouteFacts f;
        if (body.is_object()) {
            if (body.contains("model") && body["model"].is_string()) f.model = body["model"].get<std::string>();
            for (const char * k : {"max_completion_tokens", "max_tokens"}) {
                if (body.contains(k) && body[k].is_number_integer()) {
                    f.max_tokens = body[k].get<int64_t>();
                    break;
                }
            }
            if (counter_)
                f.prompt_tokens =
                    (chat ? counter_->chat(body, req.body.size(), enough) : counter_->completion(body)).value_or(-1);
        }
        {
            // The tenant's class; a client header may lower it, or raise it as far as the tenant
            // may (an admin key, any class).
            std::string why;
            auto latency = rc.latency_for(caller.tenant_name, req.header("x-armada-latency"), caller.admin, why);
            if (!latency) {
                const std::string asked = req.header("x-armada-latency");
                const bool known =
                    std::find(rc.latency_classes.begin(), rc.latency_classes.end(), asked) != rc.latency_classes.end();
                return send_error(out, known ? 403 : 400, why, 0, "latency_class");
            }
            f.latency = std::move(*latency);
        }
        f.tenant = caller.tenant_name;
        // Anything malformed goes to a node, which answers it with its own 400.
        const auto choice =
            body.is_object() ? cluster::choose_route(rc.routes, f) : cluster::RouteChoice{"cpu", "default"};
        std::string target = choice.target, rule = choice.rule;
        auto fits = [&](int64_t ctx) { return f.prompt_tokens < 0 || ctx <= 0 || f.prompt_tokens < ctx; };
        // A prompt too long for the chosen target and for the CPU goes to any pool that holds it.
        if (!fits(target == "cpu" ? cpu_ctx : pools_->context(target)) && !fits(cpu_ctx)) {
            for (const auto & name : pools_->names()) {
                if (fits(pools_->context(name))) {
                    target = name;
                    rule = "context";
                    break;
                }
            }
        }
        auto first_node = [&]() { return chat ? affinity(req, caller) : std::nullopt; };
        if (target == "cpu") {
            if (!fits(cpu_ctx))
                return send_error(out, 413,
                                  "the prompt has " + std::to_string(f.prompt_tokens) +
                                      " tokens, more than any target holds (the CPU nodes: " + std::to_string(cpu_ctx) +
                                      " per sequence); shorten the input",
                                  0, "context_length_exceeded");
            count_route("cpu", rule);
            return relay_by_load(req, out, first_node(), usage,
                                 {{"X-Armada-Route", "cpu"}, {"X-Armada-Route-Rule", rule}});
        }
        std::string reason = "context";
        if (fits(pools_->context(target))) {
            // Checked as a node would check it, once, before any upstream is taken: what a node
            // refuses, the pool path refuses with the same words.
            PoolRequestOptions po;
            po.chat = chat;
            po.context = pools_->context(target);
            try {
                po.model = "check";
                (void)pool_request_body(body, po);
            } catch (const api::ApiError & e) {
                return out->send(e.status, "application/json", api::error_body(e.status, e.what(), e.param, e.code));
            }
            std::set<std::string> tried;
            // llama.cpp's own constraint fields: only upstreams of that dialect honour them.
            const bool llama_grammar = body.contains("grammar") || body.contains("json_schema");
            for (;;) {
                PoolSet::Unavailable why = PoolSet::Unavailable::none;
                auto l = pools_->acquire(target, tried, llama_grammar, why);
                if (!l) {
                    if (tried.empty()) reason = why == PoolSet::Unavailable::full ? "full" : "down";
                    break;
                }
                // Only the fields Armada knows, with the model the upstream serves (the client named
                // the cluster's), and the tenant's cache salt where the upstream takes one.
                po.model = l->model;
                po.cache_salt = l->cache_salt ? tenant_cache_salt(caller.tenant) : std::string();
                const std::string text = pool_request_body(body, po);
                RelayTarget t;
                t.base = l->url;
                t.headers = {{"content-type", "application/json"}};
                if (!l->key.empty()) t.headers.emplace_back("authorization", "Bearer " + l->key);
                for (const char * h : {"accept", "traceparent", "tracestate", "x-request-id"}) {
                    if (auto v = req.header(h); !v.empty()) t.headers.emplace_back(h, v);
                }
                t.body = &text;
                t.timeout_ms = l->timeout_ms;
                t.idle_ms = l->timeout_ms;  // a stream that hangs after its head counts as failed
                t.extra = {{"X-Armada-Route", target}, {"X-Armada-Route-Rule", rule}};
                t.may_resend = true;  // a generation has no side effect: another target may take it
                t.hold_errors = true;
                t.scrub = true;
                const Relayed r = relay_to(t, req, out, usage);
                const bool refused = r.status >= 500 || r.status == 401 || r.status == 403 || r.status == 404;
                const PoolOutcome o = r.cut || (!r.delivered && refused) ? PoolOutcome::failed
                                      : r.client_gone                    ? PoolOutcome::cancelled
                                      : r.status == 0                    ? PoolOutcome::failed
                                      : r.status == 429                  ? PoolOutcome::busy
                                                                         : PoolOutcome::ok;
                pools_->release(*l, o, r.head_s);
                if (r.delivered || r.client_gone) {
                    if (r.delivered) count_route(target, rule);
                    return;
                }
                tried.insert(l->url);
                reason = o == PoolOutcome::busy ? "full" : "failed";
            }
        }
        if (fits(cpu_ctx)) {
            {
                std::lock_guard lk(mu_);
                ++fallbacks_[{target, reason}];
            }
            count_route("cpu", rule);
            return relay_by_load(
                req, out, first_node(), usage,
                {{"X-Armada-Route", "cpu; degraded=" + target + "-unavailable"}, {"X-Armada-Route-Rule", rule}});
        }
        if (reason == "context")
            return send_error(out, 413,
                              "the prompt has " + std::to_string(f.prompt_tokens) +
                                  " tokens, more than any target holds (pool " + target + ": " +
                                  std::to_string(pools_->context(target)) +
                                  ", the CPU nodes: " + std::to_string(cpu_ctx) + " per sequence); shorten the input",
                              0, "context_length_exceeded");
        send_error(out, 503,
                   "pool " + target + " is " + (reason == "full" ? "full" : "unavailable") + ", and the prompt's " +
                       std::to_string(f.prompt_tokens) + " tokens do not fit the CPU nodes (" +
                       std::to_string(cpu_ctx) + " per sequence); retry shortly",
                   2, "pool_unavailable");
    }

    //! Refuses new work of a tenant whose sessions hold its KV quota or more on the nodes (their
    //! load reports in etcd, the same for every gateway).
    std::optional<cluster::QuotaRefusal> kv_held(const Authed & a) {
        if (a.quota.kv_bytes <= 0) return std::nullopt;
        int64_t held = 0;
        {
            std::lock_guard lk(mu_);
            for (const auto & [name, v] : nodes_) {
                if (auto it = v.load.kv_by_tenant.find(a.caller.tenant); it != v.load.kv_by_tenant.end())
                    held += it->second;
            }
        }
        if (held < a.quota.kv_bytes) return std::nullopt;
        return cluster::QuotaRefusal{"kv_bytes", a.quota.kv_bytes, 5, false};
    }

    //! A reservation of model tokens for one request.
    struct Tokens {
        std::string tenant;  // "" when none was made
        cluster::Quotas::TokenHold hold;
        int64_t prompt = 0;  // of the estimate
        UsageScan scan;
    };
    //! Tokens a request may use: its prompt (about 4 bytes a token, set in `prompt`) and what it
    //! may generate.
    static int64_t estimate_tokens(const std::string & body_text, int64_t & prompt) {
        const json body = json::parse(body_text, nullptr, false);
        int64_t out = 256;
        if (body.is_object()) {
            for (const char * k : {"max_completion_tokens", "max_tokens", "max_output_tokens"}) {
                if (body.contains(k) && body[k].is_number_integer() && body[k].get<int64_t>() > 0) {
                    // Far above any context: the node refuses it anyway.
                    out = std::min<int64_t>(body[k].get<int64_t>(), int64_t(1) << 24);
                    break;
                }
            }
        }
        prompt = int64_t(body_text.size() / 4);
        return prompt + out;
    }

    std::string render_metrics() {
        obs::Registry m;
        {
            std::lock_guard lk(mu_);
            m.gauge("armada_gateway_nodes", "Live nodes the gateway sees in etcd").set(double(nodes_.size()));
        }
        m.sync_counter("armada_gateway_requests_total", "Requests the gateway took", requests_.load());
        for (size_t c = 1; c < answers_.size(); ++c)
            m.sync_counter("armada_gateway_responses_total", "Answers the gateway gave, by status class",
                           answers_[c].load(), {{"code", std::to_string(c) + "xx"}});
        m.sync_counter("armada_gateway_streams_refused_total",
                       "Session event streams refused (429): the tenant had its cap of them open",
                       refused_streams_.load());
        m.sync_counter("armada_gateway_workers_refused_total",
                       "Requests refused (503): every worker thread was busy and the gateway had its cap of them",
                       refused_workers_.load());
        m.gauge("armada_gateway_worker_threads", "Worker threads alive (busy or idle)").set(double(workers_.threads()));
        m.sync_counter("armada_gateway_sessions_refused_full_total",
                       "New sessions refused (503 cluster_full) because every cell was at its water level",
                       refused_full_.load());
        {
            // A registry made per scrape: the tracer's running totals are copied, not attached.
            const auto t = obs::tracer();
            m.sync_counter("armada_trace_spans_exported_total", "Spans the OTLP collector accepted", t->exported());
            m.sync_counter("armada_trace_spans_dropped_total",
                           "Spans dropped: the queue was full or the collector refused or was away", t->dropped());
        }
        {
            std::lock_guard lk(mu_);
            for (const auto & [quota, n] : refused_)
                m.sync_counter("armada_gateway_quota_refused_total", "Requests refused (429) by a quota", n,
                               {{"quota", quota}});
        }
        m.gauge("armada_gateway_quota_local",
                "1 while Redis cannot be reached and this gateway enforces its share of each quota alone")
            .set(quotas_->local() ? 1 : 0);
        m.sync_counter("armada_gateway_quota_local_decisions_total",
                       "Quota decisions this gateway made alone (Redis unreachable)", quotas_->local_decisions());
        m.gauge("armada_gateway_live_gateways", "Gateways live in etcd (each one's share of a quota without Redis)")
            .set(live_gateways_.load());
        m.sync_counter("armada_gateway_route_cache_hits_total", "Session reads routed from the Redis route cache",
                       route_hits_.load());
        if (auto p = store_->pool_stats()) obs::pool_metrics(m, "armada_store_pool", *p);
        if (redis_) obs::pool_metrics(m, "armada_redis_pool", redis_->stats());
        {
            std::lock_guard lk(mu_);
            for (const auto & [k, n] : routed_)
                m.sync_counter(
                    "armada_gateway_routed_total",
                    "Chat and text completions by where they went (cpu or a pool) and the rule that chose it", n,
                    {{"route", k.first}, {"rule", k.second}});
            for (const auto & [k, n] : fallbacks_)
                m.sync_counter("armada_gateway_route_fallbacks_total",
                               "Requests a rule sent to a pool that went to the CPU nodes instead, by why", n,
                               {{"pool", k.first}, {"reason", k.second}});
        }
        return m.render() + (pools_ ? pools_->render_metrics() : std::string());
    }

    //! Chat completions of one conversation go to the node that served its start, where its
    //! prompt prefix is cached: a hash of the tenant and the first two messages picks it.
    std::optional<std::string> affinity(const HttpRequest & req, const api::Caller & caller) {
        const json body = json::parse(req.body, nullptr, false);
        // Anything malformed goes by load: the node answers it with its own 400.
        if (!body.is_object() || !body.contains("messages") || !body["messages"].is_array()) return std::nullopt;
        if (body.contains("model") && !body["model"].is_string()) return std::nullopt;
        std::string text = caller.tenant + "\x1f" + body.value("model", "");
        size_t first = 0;
        for (const auto & m : body["messages"]) {
            if (first++ == 2) break;
            text += "\x1f" + m.dump();
        }
        const uint64_t h = fnv1a(text);
        const int64_t t = common::steady_ms();
        if (redis_) {
            // Shared by every gateway, with a TTL that each turn starts again: the conversation's
            // node, while it has room.
            char hex[17];
            snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
            const std::string k = "armada:t:" + caller.tenant + ":affinity:" + hex;
            const auto bound = redis_->get(k, int64_t(o_.affinity_ttl_s) * 1000);
            std::optional<std::string> n;
            {
                std::lock_guard lk(mu_);
                n = chat_route(nodes_, bound, rr_);
            }
            // New, or its node is full, draining or gone: the one by load is remembered.
            if (n && n != bound) redis_->set(k, *n, int64_t(o_.affinity_ttl_s) * 1000);
            return n;
        }
        std::lock_guard lk(mu_);
        std::optional<std::string> bound;
        if (auto it = affinity_.find(h); it != affinity_.end() && it->second.second > t) bound = it->second.first;
        auto n = chat_route(nodes_, bound, rr_);
        if (!n) return std::nullopt;
        if (affinity_.size() > 100000) affinity_.clear();
        affinity_[h] = {*n, t + int64_t(o_.affinity_ttl_s) * 1000};
        return n;
    }

    // ---- /admin: tenants and keys in PostgreSQL (admin keys only) ----
    void admin(const HttpRequest & req, const std::shared_ptr<Responder> & out, const api::Caller & caller,
               const std::vector<std::string> & parts) {
        if (!caller.admin) return send_error(out, 403, "/admin needs an admin key", 0, "permission_denied");
        // Without an admin key of its own, the first key made here would lock everyone out.
        if (forward_key_.empty())
            return send_error(out, 403,
                              "/admin needs the gateway to have an admin key of its own (--api-key or ARMADA_API_KEY)",
                              0, "permission_denied");
        const std::string & m = req.method;
        if (parts.size() == 2 && parts[1] == "pools" && m == "GET")
            return out->send(
                200, "application/json",
                json{{"object", "pools"}, {"pools", pools_ ? pools_->status(true) : json::object()}}.dump());
        if (parts.size() >= 2 && parts.size() <= 3 && parts[1] == "tenants") {
            if (parts.size() == 2 && m == "GET") {
                auto all = store_->tenants();
                if (!all) return store_down(out);
                json data = json::array();
                for (const auto & t : *all)
                    data.push_back(tenant_json(t));
                return out->send(200, "application/json", json{{"object", "list"}, {"data", data}}.dump());
            }
            if (parts.size() == 2 && m == "POST") return put_tenant(req, out, std::nullopt);
            if (parts.size() == 3 && (m == "PATCH" || m == "PUT")) return put_tenant(req, out, parts[2]);
            if (parts.size() == 3 && m == "GET") {
                auto all = store_->tenants();
                if (!all) return store_down(out);
                for (const auto & t : *all) {
                    if (t.name == parts[2]) return out->send(200, "application/json", tenant_json(t).dump());
                }
                return send_error(out, 404, "no tenant named '" + parts[2] + "'", 0, "not_found");
            }
            if (parts.size() == 3 && m == "DELETE") {
                auto r = store_->delete_tenant(parts[2]);
                if (r == store::AdminResult::unavailable) return store_down(out);
                if (r == store::AdminResult::missing)
                    return send_error(out, 404, "no tenant named '" + parts[2] + "'", 0, "not_found");
                load_directory();
                spdlog::info("gateway: tenant '{}' deleted, with its keys", parts[2]);
                return out->send(200, "application/json",
                                 json{{"object", "tenant"}, {"name", parts[2]}, {"deleted", true}}.dump());
            }
        }
        if (parts.size() >= 2 && parts.size() <= 3 && parts[1] == "keys") {
            if (parts.size() == 2 && m == "GET") {
                auto all = store_->keys();
                if (!all) return store_down(out);
                const std::string only = req.param("tenant");
                json data = json::array();
                for (const auto & k : *all) {
                    if (only.empty() || k.tenant == only) data.push_back(key_json(k));
                }
                return out->send(200, "application/json", json{{"object", "list"}, {"data", data}}.dump());
            }
            if (parts.size() == 2 && m == "POST") return create_key(req, out);
            if (parts.size() == 3 && m == "DELETE") {
                auto r = store_->delete_key(parts[2]);
                if (r == store::AdminResult::unavailable) return store_down(out);
                if (r == store::AdminResult::missing)
                    return send_error(out, 404, "no API key with id '" + parts[2] + "'", 0, "not_found");
                load_directory();
                spdlog::info("gateway: API key {} deleted", parts[2]);
                return out->send(200, "application/json",
                                 json{{"object", "api_key"}, {"id", parts[2]}, {"deleted", true}}.dump());
            }
        }
        send_error(out, 404,
                   "no admin route " + m + " " + req.path +
                       "; there are /admin/tenants[/NAME] (GET, POST, PATCH, DELETE), /admin/keys[/ID] (GET, POST, "
                       "DELETE) and /admin/pools (GET)",
                   0, "not_found");
    }
    static void store_down(const std::shared_ptr<Responder> & out) {
        send_error(out, 503, "the cluster's state store cannot be reached; retry shortly", 2, "store_unavailable");
    }
    //! POST /admin/tenants (a new one, `name` in the body) or PATCH /admin/tenants/NAME (its quotas).
    void put_tenant(const HttpRequest & req, const std::shared_ptr<Responder> & out,
                    const std::optional<std::string> & name) {
        const json body = json::parse(req.body.empty() ? std::string("{}") : req.body, nullptr, false);
        if (!body.is_object()) return send_error(out, 400, "the body must be a JSON object");
        store::TenantRecord t;
        if (name) {
            auto all = store_->tenants();
            if (!all) return store_down(out);
            auto it = std::find_if(all->begin(), all->end(), [&](const auto & x) { return x.name == *name; });
            if (it == all->end()) return send_error(out, 404, "no tenant named '" + *name + "'", 0, "not_found");
            t = *it;
        }
        for (const auto & [k, v] : body.items()) {
            if (k == "name") {
                if (name) {
                    if (v != *name) return send_error(out, 400, "a tenant's name cannot change");
                    continue;
                }
                if (!v.is_string() || !api::valid_tenant_name(v.get<std::string>()))
                    return send_error(out, 400, "'name' must be 1 to 64 letters, digits, '_', '-' or '.'", 0);
                t.name = v.get<std::string>();
                continue;
            }
            int64_t * field = k == kQuotaFields[0]   ? &t.rpm
                              : k == kQuotaFields[1] ? &t.tpm
                              : k == kQuotaFields[2] ? &t.live_sessions
                              : k == kQuotaFields[3] ? &t.kv_bytes
                                                     : nullptr;
            if (!field)
                return send_error(out, 400,
                                  "unknown field '" + k +
                                      "'; a tenant has name, requests_per_minute, tokens_per_minute, live_sessions "
                                      "and kv_bytes");
            if (!v.is_number_integer() || v.get<int64_t>() < 0)
                return send_error(out, 400, "'" + k + "' must be a whole number, 0 or more (0 is unlimited)");
            *field = v.get<int64_t>();
        }
        if (t.name.empty()) return send_error(out, 400, "'name' is required");
        t.updated_ms = common::wall_ms();
        if (!name) t.created_ms = t.updated_ms;
        auto r = name ? store_->update_tenant(t) : store_->create_tenant(t);
        if (r == store::AdminResult::unavailable) return store_down(out);
        if (r == store::AdminResult::exists)
            return send_error(out, 409, "a tenant named '" + t.name + "' exists already", 0, "conflict");
        if (r == store::AdminResult::missing)
            return send_error(out, 404, "no tenant named '" + t.name + "'", 0, "not_found");
        load_directory();
        spdlog::info("gateway: tenant '{}' {}: rpm {} tpm {} live sessions {} kv bytes {}", t.name,
                     name ? "updated" : "created", t.rpm, t.tpm, t.live_sessions, t.kv_bytes);
        out->send(name ? 200 : 201, "application/json", tenant_json(t).dump());
    }
    //! POST /admin/keys: a new key for a tenant; the key is in this answer only.
    void create_key(const HttpRequest & req, const std::shared_ptr<Responder> & out) {
        const json body = json::parse(req.body.empty() ? std::string("{}") : req.body, nullptr, false);
        if (!body.is_object()) return send_error(out, 400, "the body must be a JSON object");
        store::KeyRecord k;
        for (const auto & [f, v] : body.items()) {
            if (f == "tenant" && v.is_string()) {
                k.tenant = v.get<std::string>();
            } else if (f == "admin" && v.is_boolean()) {
                k.admin = v.get<bool>();
            } else {
                return send_error(out, 400,
                                  f == "tenant" || f == "admin"
                                      ? "'" + f + "' must be a " + (f == "admin" ? "boolean" : "string")
                                      : "unknown field '" + f + "'; a key has tenant and admin");
            }
        }
        if (k.tenant.empty()) return send_error(out, 400, "'tenant' is required");
        const std::string key = "sk-armada-" + random_hex(24);
        k.id = "key_" + random_hex(8);
        k.hash = sha256_hex(key);
        k.prefix = key.substr(0, 14);
        k.created_ms = common::wall_ms();
        auto r = store_->create_key(k);
        if (r == store::AdminResult::unavailable) return store_down(out);
        if (r == store::AdminResult::missing)
            return send_error(out, 404, "no tenant named '" + k.tenant + "'; create it first", 0, "not_found");
        if (r != store::AdminResult::ok) return send_error(out, 500, "could not store the key; try again");
        load_directory();
        spdlog::info("gateway: API key {} ({}…) created for tenant '{}'{}", k.id, k.prefix, k.tenant,
                     k.admin ? " (admin)" : "");
        json j = key_json(k);
        j["key"] = key;  // shown once: only its hash is kept
        out->send(201, "application/json", j.dump());
    }

    void create_session(const HttpRequest & req, const std::shared_ptr<Responder> & out, const Authed & authed,
                        const std::string & agent_id) {
        const api::Caller & caller = authed.caller;
        std::string input;
        if (!req.body.empty()) {
            const json body = json::parse(req.body, nullptr, false);
            if (!body.is_object()) return send_error(out, 400, "the body must be a JSON object");
            for (const char * k : {"input", "content"}) {
                if (body.contains(k) && !body[k].is_null()) {
                    if (!body[k].is_string()) return send_error(out, 400, std::string("'") + k + "' must be a string");
                    input = body[k].get<std::string>();
                    break;
                }
            }
        }
        // The agent must exist for this caller: a node answers that as it would for itself.
        HttpRequest probe;
        probe.method = "GET";
        probe.path = "/v1/agents/" + agent_id;
        probe.headers = req.headers;
        std::optional<UpstreamReply> seen, last_refusal;
        std::set<std::string> tried;
        for (int attempt = 0; attempt < 3 && !seen; ++attempt) {
            auto n = by_load({}, tried);
            if (!n) break;
            auto v = node(*n);
            if (!v) break;
            auto r = forward(v->load.url, "GET", probe.path, pass_headers(probe), "", 10000);
            if (r.status == 0) {
                tried.insert(*n);
                if (!r.sent) forget(*n);  // unreachable; a hung node keeps its sessions
                continue;
            }
            // A node that began draining (or is still loading) since its last report refuses
            // with 503: another node answers for the cluster.
            if (r.status == 503) {
                tried.insert(*n);
                last_refusal = std::move(r);
                continue;
            }
            seen = std::move(r);
        }
        if (!seen && last_refusal) seen = std::move(last_refusal);
        if (!seen) return send_error(out, 503, "no node of the cluster is ready; retry shortly", 2, "no_node");
        if (seen->status == 404) return send_error(out, 404, "no agent with id '" + agent_id + "'");
        if (seen->status != 200) {
            // The node's answer as it gave it, with its Retry-After.
            std::string ctype = "application/json";
            api::Headers h;
            for (const auto & [k, val] : seen->headers) {
                if (strcasecmp(k.c_str(), "content-type") == 0)
                    ctype = val;
                else
                    h.emplace_back(k, val);
            }
            out->send(seen->status, ctype, seen->body, std::move(h));
            return;
        }
        const std::string cell = pick_cell(caller.tenant);
        if (cell.empty()) {
            ++refused_full_;
            return send_error(out, 503,
                              "every cell is at its water level (the room above it is kept for the sessions of a cell "
                              "that fails); retry shortly",
                              5, "cluster_full");
        }
        const std::string id = agent::SessionManager::new_id();
        // A tenant whose tokens of the minute are spent (its sessions' model steps count) gets no
        // new session; the one token taken here stands for the request.
        if (authed.quota.tpm > 0) {
            cluster::Quotas::TokenHold hold;
            if (auto r = quotas_->reserve_tokens(caller.tenant, authed.quota.tpm, 1, hold))
                return refuse(out, caller, *r);
        }
        if (auto r = quotas_->live_session(caller.tenant, id, authed.quota.live_sessions,
                                           [&] { return open_sessions(caller.tenant); }))
            return refuse(out, caller, *r);
        auto b = store::new_session_batch(id, agent_id, caller.tenant, input, cell, common::wall_ms());
        if (auto st = commit(std::move(b)); !st.ok) {
            quotas_->forget_session(caller.tenant, id);
            return send_error(out, 503, "could not store the session: " + st.error, 2);
        }
        // The row is durable: the brain finds it at its next reconcile even if this is lost.
        json place = {{"session", id}};
        if (const std::string tp = req.header("traceparent"); !tp.empty()) place["traceparent"] = tp;
        // Acknowledged before the 201 while NATS answers (the brain takes it at once, even if
        // NATS then restarts); while it has not answered a publish in time lately, sent without
        // waiting, so a NATS that hangs does not hold every create.
        const int64_t slow_at = nats_slow_at_.load();
        std::string e;
        if (slow_at > 0 && common::steady_ms() - slow_at < 10000) {
            e = js_->publish_async(cluster::place_subject(cell), place.dump(), id);
        } else {
            e = js_->publish(cluster::place_subject(cell), place.dump(), id, 1000);
            if (!e.empty()) nats_slow_at_ = common::steady_ms();
        }
        if (!e.empty())
            spdlog::warn("gateway: place request for {} to {}: {} (the cell's reconcile places it)", id, cell, e);
        out->send(201, "application/json", json{{"id", id}, {"object", "session"}}.dump());
    }

    //! The ids of `tenant`'s sessions that have not ended, as PostgreSQL says now.
    std::optional<std::vector<std::string>> open_sessions(const std::string & tenant) {
        return store_->open_ids_of(tenant, kEndedStates);
    }

    //! Writes `b`, clearing an earlier failure of the store first (PostgreSQL restarted), and
    //! tries once more after a pause if the write fails.
    store::Status commit(store::Batch b) {
        store::Status st;
        for (int attempt = 0; attempt < 2; ++attempt) {
            if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(cluster::jittered_ms(500)));
            if (!store_->writable().ok) store_->recover();
            st = store_->commit_sync(b);
            if (st.ok || st.fenced) return st;
        }
        return st;
    }
    //! The session's row; nullopt with `unavailable` set when the store cannot be read now (so
    //! that a client is told to retry, not that its session does not exist).
    std::optional<store::SessionRecord> lookup(const std::string & id, bool & unavailable) {
        return lookup_session(
            *store_, id,
            [this] {
                store::Batch probe;
                probe.probe = true;
                return commit(std::move(probe)).ok;
            },
            unavailable);
    }

    //! The node that holds session `rec` now, while etcd holds its key (a node a connect failed
    //! to included): a request for the session goes there or nowhere, never to a node by load.
    std::optional<std::string> holder(const store::SessionRecord & rec) {
        if (rec.node.empty() || rec.epoch <= 0) return std::nullopt;
        std::lock_guard lk(mu_);
        if (!nodes_.count(rec.node) && !unreachable_.count(rec.node)) return std::nullopt;
        return rec.node;
    }

    static std::string route_key(const api::Caller & caller, const std::string & id) {
        return "armada:t:" + caller.tenant + ":session:" + id + ":route";
    }

    void session_route(HttpRequest & req, const std::shared_ptr<Responder> & out, const api::Caller & caller,
                       const std::string & id, const std::string & sub) {
        // Reads go to the node the route cache names (written after a PostgreSQL lookup for this
        // tenant); changes always ask PostgreSQL, so a stale route never moves a session.
        if (redis_ && req.method == "GET" && sub.empty()) {
            if (auto n = redis_->get(route_key(caller, id)); n && node(*n)) {
                ++route_hits_;
                if (relay(*n, req, out, nullptr, kSessionRelayMs).delivered) return;
                redis_->del(route_key(caller, id));
            }
        }
        bool unavailable = false;
        auto rec = lookup(id, unavailable);
        if (unavailable)
            return send_error(out, 503, "the cluster's state store cannot be reached; retry shortly", 2,
                              "store_unavailable");
        if (!rec || rec->owner != caller.tenant || rec->agent_id.rfind('@', 0) == 0)
            return send_error(out, 404, "no session with id '" + id + "'");
        if (sub == "events" && req.method == "GET") {
            // Each open stream holds a worker thread and two descriptors: a tenant has its cap.
            StreamSlot slot(*this, caller.tenant);
            if (!slot.held) {
                ++refused_streams_;
                return send_error(out, 429,
                                  "this tenant has " + std::to_string(o_.max_streams_per_tenant) +
                                      " event streams open through this gateway, its limit; close one or retry later",
                                  5, "too_many_streams");
            }
            return events(req, out, id);
        }
        // A request to a session goes to its node; one not placed yet, or whose node is gone
        // (its lease ended), goes to any node, which answers from the store (or takes the session
        // over). A node that holds its lease but does not answer keeps the session: another node
        // taking it would fence a live owner behind its cell's back. The client retries.
        std::string silent;
        for (int attempt = 0; attempt < 3; ++attempt) {
            silent.clear();  // what the last attempt found decides the error
            auto h = holder(*rec);
            if (h && redis_) redis_->set(route_key(caller, id), *h, 30000);
            auto n = h ? h : by_load(rec->cell);
            if (!n) n = by_load();
            if (!n) break;
            const Relayed r = relay(*n, req, out, nullptr, kSessionRelayMs);
            if (r.delivered) return;
            if (h) {
                silent = *h;
            } else if (!r.reached) {
                forget(*n);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            auto again = lookup(id, unavailable);
            if (again) rec = again;
        }
        if (!silent.empty())
            return send_error(out, 503,
                              "the node holding session '" + id +
                                  "' does not answer; retry shortly (if it is gone, the session moves once its "
                                  "lease ends)",
                              2, "node_unavailable");
        send_error(out, 503, "no node of the cluster is ready to take this request; retry shortly", 2, "no_node");
    }
    //! Session reads and changes answer at once on a node: one that says nothing for this long is
    //! taken as hung (a relay's default waits 10 minutes, for generations).
    static constexpr int kSessionRelayMs = 10000;

    //! A node's event stream says something at least every 5 s (a comment when quiet): one
    //! silent for this long comes from a hung node, and the gateway looks up the holder again.
    static constexpr int kEventsIdleMs = 15000;

    //! The session's event stream, from whichever node holds it; when it moves (its node died,
    //! hung or was fenced) the stream goes on from the new node with Last-Event-ID. Only whole
    //! events reach the client, so a reconnect never repeats or splits one.
    void events(const HttpRequest & req, const std::shared_ptr<Responder> & out, const std::string & id) {
        std::string last = req.header("last-event-id");
        if (last.empty()) last = req.param("last_event_id");
        bool started = false;
        int64_t waiting_since = 0;
        for (;;) {
            if (out->closed()) return;
            bool unavailable = false;
            auto rec = lookup(id, unavailable);
            if (unavailable) {
                // The store is restarting: the stream waits for it.
                std::this_thread::sleep_for(std::chrono::milliseconds(250));
                continue;
            }
            if (!rec) {
                if (started)
                    out->end();
                else
                    send_error(out, 404, "no session with id '" + id + "'");
                return;
            }
            const bool ended = std::find(kEndedStates.begin(), kEndedStates.end(), rec->state) != kEndedStates.end();
            auto n = holder(*rec);
            if (!n && ended) n = by_load();
            if (!n) {
                // Not placed yet, or its node died and the brain has not moved it yet.
                if (waiting_since == 0) waiting_since = common::steady_ms();
                if (common::steady_ms() - waiting_since > 120000) {
                    if (started)
                        out->end();
                    else
                        send_error(out, 503, "the session has no node yet; retry shortly", 2, "no_node");
                    return;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
                continue;
            }
            waiting_since = 0;
            auto v = node(*n);
            if (!v) {
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
                continue;
            }
            HeaderList h = pass_headers(req);
            if (!last.empty()) h.emplace_back("Last-Event-ID", last);
            std::string target = "/v1/sessions/" + id + "/events";
            std::string buf;
            bool refused = false;
            // The client going away ends the node's stream too (even while it is quiet).
            auto cancel = std::make_shared<CancelToken>();
            out->on_close([cancel] { cancel->cancel(); });
            auto r = forward(
                v->load.url, "GET", target, h, "", 10000,
                [&](const UpstreamReply & head) {
                    if (head.status != 200) {
                        refused = true;
                        return false;
                    }
                    if (!started) {
                        out->start_stream(200);
                        out->long_lived();
                        started = true;
                    }
                    return true;
                },
                [&](std::string_view chunk) {
                    if (out->closed()) return false;
                    buf.append(chunk);
                    for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
                        std::string ev = buf.substr(0, end + 2);
                        buf.erase(0, end + 2);
                        // Its id line, if it has one, is where a reconnect starts from.
                        for (size_t at = 0; at < ev.size();) {
                            const size_t nl = ev.find('\n', at);
                            const std::string line = ev.substr(at, nl - at);
                            if (line.rfind("id:", 0) == 0)
                                last = line.substr(line.size() > 3 && line[3] == ' ' ? 4 : 3);
                            at = nl == std::string::npos ? ev.size() : nl + 1;
                        }
                        out->write(std::move(ev));
                    }
                    return true;
                },
                cancel, kEventsIdleMs);
            if (out->closed()) return;
            if (r.invalid) {
                // A last guard (the request was checked): nothing went to the node.
                if (started)
                    out->end();
                else
                    send_error(out, 400, "the request holds bytes the gateway does not pass on: " + r.error);
                return;
            }
            if (refused && !started) {
                // The node's own answer (404 after a delete, 400 for a bad Last-Event-ID…).
                std::string ctype = "application/json";
                for (const auto & [k, val] : r.headers) {
                    if (strcasecmp(k.c_str(), "content-type") == 0) ctype = val;
                }
                if (r.status == 404 || r.status == 400 || r.status == 401 || r.status == 403) {
                    out->send(r.status, ctype, r.body);
                    return;
                }
            }
            // A holder that took the request and then said nothing is hung, not gone: it keeps
            // the session (and the lookup above goes on naming it) until its lease ends.
            if (r.status == 0 && !r.sent) forget(*n);
            if (!r.error.empty())
                spdlog::warn("gateway: the event stream of session {} from {} broke: {}; following it", id, *n,
                             r.error);
            // The node ended the stream. If the session ended, so does the stream; otherwise it
            // moved (or its node died): follow it.
            bool gone = false;
            auto now = lookup(id, gone);
            if (gone) {
                // The store is restarting: look again in a moment.
                std::this_thread::sleep_for(std::chrono::milliseconds(250));
                continue;
            }
            const bool over =
                !now || std::find(kEndedStates.begin(), kEndedStates.end(), now->state) != kEndedStates.end();
            // Only a stream the node ended itself is whole: one cut short (the node died or hung)
            // is taken up again from Last-Event-ID, wherever the session is now, for its last events.
            if (over && r.status == 200 && !refused && r.error.empty()) {
                out->end();
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    }

    cluster::ClusterConfig cfg_;
    GatewayOptions o_;
    api::ApiKeys keys_;
    cluster::EtcdClient etcd_;
    std::unique_ptr<store::PostgresStore> store_;
    std::unique_ptr<cluster::JetStream> js_;
    std::unique_ptr<cluster::RedisPool> redis_;
    std::atomic<uint64_t> requests_{0}, route_hits_{0};
    std::array<std::atomic<uint64_t>, 6> answers_{};  // by status class: [5] counts 5xx
    void count_status(int status) {
        if (status >= 100 && status < 600) ++answers_[size_t(status / 100)];
    }
    std::atomic<uint64_t> refused_full_{0};  // new sessions refused: every cell at its water level
    std::unique_ptr<cluster::Quotas> quotas_;
    //! The routing rules and latency classes as of the last start or SIGHUP (mu_).
    std::shared_ptr<const cluster::RoutingConfig> routing_;
    std::shared_ptr<const cluster::RoutingConfig> routing() {
        std::lock_guard lk(mu_);
        return routing_;
    }
    std::unique_ptr<PromptCounter> counter_;  // counts prompts for the routing rules (`tokenizer:`)
    std::unique_ptr<PoolSet> pools_;          // GPU pools (`pools:`); null: none
    std::map<std::pair<std::string, std::string>, uint64_t> routed_;     // (route, rule) → requests; mu_
    std::map<std::pair<std::string, std::string>, uint64_t> fallbacks_;  // (pool, reason) → requests; mu_
    std::atomic<int> live_gateways_{1};
    std::string forward_key_;               // an admin key of the gateway's own
    std::string name_, url_;                // in etcd's gateways, under lease_
    int64_t lease_ = 0, announced_ms_ = 0;  // the watcher thread's
    std::atomic<int64_t> directory_ms_{0};  // the last load
    std::atomic<bool> directory_warned_{false};
    std::mutex mu_;
    std::shared_ptr<const Directory> directory_;    // guarded by mu_
    std::map<std::string, uint64_t> refused_;       // quota → 429s; mu_
    NodeViews nodes_;                               // guarded by mu_
    std::atomic<int64_t> nats_slow_at_{0};          // when a place request's publish last failed
    NodeViews unreachable_;                         // nodes a connect failed to, until etcd speaks of them (mu_)
    Reports reports_;                               // the cells' aggregates; mu_
    std::optional<cluster::RolloutState> rollout_;  // the rollout's state in etcd; mu_
    cluster::Shares shares_;                        // guarded by mu_
    std::map<uint64_t, std::pair<std::string, int64_t>> affinity_;  // hash → (node, expiry); mu_
    uint64_t rr_ = 0;                                               // guarded by mu_
    std::atomic<bool> etcd_warned_{false};                          // etcd could not be read: the view is the last one
    std::unique_ptr<cluster::EtcdKvStore> kv_;
    std::unique_ptr<ClusterFollower> follower_view_;  // the follower thread's (after start)
    std::set<std::string> gateways_;                  // the follower's (after start)
    std::atomic<bool> stop_{false};
    std::atomic<size_t> in_flight_{0};
    BodyLimits body_limits_;
    //! A tenant's open event streams (o_.max_streams_per_tenant).
    std::mutex streams_mu_;
    std::map<std::string, size_t> streams_;  // streams_mu_
    std::atomic<uint64_t> refused_streams_{0}, refused_workers_{0};
    struct StreamSlot {
        Gateway & g;
        std::string tenant;
        bool held = false;
        StreamSlot(Gateway & gw, std::string t) : g(gw), tenant(std::move(t)) {
            std::lock_guard lk(g.streams_mu_);
            auto & n = g.streams_[tenant];
            if (n < g.o_.max_streams_per_tenant) {
                ++n;
                held = true;
            }
        }
        ~StreamSlot() {
            std::lock_guard lk(g.streams_mu_);
            auto it = g.streams_.find(tenant);
            if (it == g.streams_.end()) return;
            if (held) --it->second;
            if (it->second == 0) g.streams_.erase(it);
        }
        StreamSlot(const StreamSlot &) = delete;
        StreamSlot & operator=(const StreamSlot &) = delete;
    };
    std::thread watcher_;   // keeps this gateway announced, reloads tenants and keys
    std::thread follower_;  // follows the cluster in etcd (`follow`)
    std::thread dasher_;    // feeds the open dashboards (`feed_dashboards`)
    static constexpr size_t kMaxDashboards = 64;
    std::mutex dash_mu_;
    std::vector<std::shared_ptr<Responder>> dashboards_;  // open event streams; dash_mu_
    WorkerPool workers_;  // runs each request (last: it ends first, once its requests have)
};

}  // namespace

int gateway_command(const GatewayOptions & opt) {
    sigset_t stop_set = common::block_stop_signals();
    sigaddset(&stop_set, SIGHUP);  // reloads the pools
    pthread_sigmask(SIG_BLOCK, &stop_set, nullptr);
    spdlog::set_level(spdlog::level::from_str(opt.log_level));
    std::string err;
    auto cfg = cluster::load_cluster_config_for_service(opt.cluster_file, err);
    if (!cfg) {
        fprintf(stderr, "error: %s\n", err.c_str());
        return 2;
    }
    if (!opt.cell.empty() && !cluster::valid_cell_or_node_name(opt.cell)) {
        fprintf(stderr, "error: --cell '%s' must be 1..63 of A-Z a-z 0-9 . _ -\n", opt.cell.c_str());
        return 2;
    }
    api::ApiKeys keys;
    keys.add(opt.api_key);
    if (!opt.api_key_file.empty()) {
        if (auto e = keys.load_file(opt.api_key_file); !e.empty()) {
            fprintf(stderr, "error: %s\n", e.c_str());
            return 2;
        }
    }
    if (!opt.name.empty() && !cluster::valid_cell_or_node_name(opt.name)) {
        fprintf(stderr, "error: --name '%s' must be 1..63 of A-Z a-z 0-9 . _ -\n", opt.name.c_str());
        return 2;
    }
    Gateway gw(*cfg, opt, std::move(keys));
    if (auto e = gw.start(); !e.empty()) {
        fprintf(stderr, "error: %s\n", e.c_str());
        return 1;
    }
    api::HttpServer http(
        opt.http, [&gw](HttpRequest && r, std::shared_ptr<Responder> out) { gw.handle(std::move(r), std::move(out)); });
    if (auto e = http.listen(); !e.empty()) {
        fprintf(stderr, "error: %s\n", e.c_str());
        return 1;
    }
    http.run();
    {
        char host[256] = "localhost";
        gethostname(host, sizeof host - 1);
        const std::string url =
            std::string(http.tls() ? "https" : "http") + "://" + opt.http.host + ":" + std::to_string(http.port());
        gw.announce(opt.name.empty() ? std::string(host) + "-" + std::to_string(http.port()) : opt.name, url);
    }
    obs::announce(fmt::format("armada: gateway listening on {}://{}:{}", http.tls() ? "https" : "http", opt.http.host,
                              http.port()));
    int sig = 0;
    for (;;) {
        sig = sigwaitinfo(&stop_set, nullptr);
        if (sig == SIGHUP) {
            gw.reload();
            continue;
        }
        if (sig > 0) break;
    }
    spdlog::info("gateway: signal {}: stopping (open streams end; clients reconnect to another gateway)", sig);
    http.set_closing();
    http.stop();
    gw.stop();
    // Requests still being forwarded are cut: their clients retry elsewhere.
    fflush(nullptr);
    std::_Exit(0);
}

}  // namespace armada::gateway

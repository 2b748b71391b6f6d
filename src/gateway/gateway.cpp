#include "gateway/gateway.h"

#include "api/errors.h"
#include "api/openapi.h"
#include "cluster/queue.h"
#include "cluster/quota.h"
#include "cluster/redis.h"
#include "cluster/runtime/kv.h"
#include "common/clock.h"
#include "gateway/admin_api.h"
#include "gateway/affinity.h"
#include "gateway/cluster_view.h"
#include "gateway/dashboard_feed.h"
#include "gateway/generation_router.h"
#include "gateway/key_directory.h"
#include "gateway/prompt_counter.h"
#include "gateway/relay.h"
#include "gateway/replies.h"
#include "gateway/routing.h"
#include "gateway/session_api.h"
#include "obs/log.h"
#include "obs/trace.h"
#include "routing/pool_set.h"
#include "store/cluster_store.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

namespace armada::gateway {

namespace {

using json = nlohmann::json;
using api::Responder;

//! How long the gateway follows one etcd watch before it lists the cluster afresh.
constexpr int64_t kRelistMs = 30000;

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

//! A reservation of model tokens for one request.
struct Tokens {
    std::string tenant;  // "" when none was made
    cluster::Quotas::TokenHold hold;
    int64_t prompt = 0;  // of the estimate
    UsageScan scan;
};
//! Tokens a request may use: its prompt (about 4 bytes a token, set in `prompt`) and what it
//! may generate.
int64_t estimate_tokens(const std::string & body_text, int64_t & prompt) {
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

}  // namespace

Gateway::Gateway(cluster::ClusterConfig cfg, GatewayOptions o, api::ApiKeys keys)
    : cfg_(std::move(cfg)),
      o_(std::move(o)),
      file_keys_(std::move(keys)),
      etcd_(cluster::make_etcd(cfg_)),
      workers_(std::chrono::seconds(30), o_.max_workers) {}

Gateway::~Gateway() {
    stop();
}

std::string Gateway::start() {
    std::string err;
    // Nodes (and pools) over HTTPS are checked against the cluster's CA too.
    if (cfg_.nodes_auth.tls()) {
        auto tls = cluster::service_tls(cfg_.nodes_auth, "credentials.nodes", err);
        if (!tls) return err;
        routing::set_upstream_tls(std::move(tls));
    }
    store::PostgresConfig pc;
    pc.urls = cfg_.postgres;
    pc.read_connections = cfg_.pg_pool;
    store_ = store::open_cluster_store(pc, err);
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
    routing_ = std::make_shared<routing::RoutingConfig>(cfg_.routing);
    if (!cfg_.routing.pools.empty()) {
        pools_ = routing::PoolSet::open(cfg_.routing.pools, err);
        if (!pools_) return err;
        pools_->start();
    }
    // The cluster as etcd shows it now, before the first request.
    kv_ = std::make_unique<cluster::EtcdKvStore>(etcd_);
    view_ = std::make_unique<ClusterView>(*kv_, cfg_.prefix, kRelistMs);
    quotas_ = std::make_unique<cluster::Quotas>(redis_.get(), [this] { return view_->live_gateways(); });
    // The key requests with keys from PostgreSQL are forwarded under: the nodes know it.
    keys_ = std::make_unique<KeyDirectory>(*store_, std::move(file_keys_), o_.api_key);
    if (!keys_->load())
        spdlog::warn("gateway: cannot read tenants and keys from PostgreSQL yet; retrying every {} ms",
                     KeyDirectory::kTtlMs);
    relay_ = std::make_unique<NodeRelay>(*view_);
    affinity_ = std::make_unique<ChatAffinity>(*view_, redis_.get(), o_.affinity_ttl_s);
    if (pools_)
        generations_ = std::make_unique<GenerationRouter>(*view_, *relay_, *affinity_, *pools_, counter_.get(), counts_,
                                                          [this] { return routing(); });
    sessions_ = std::make_unique<SessionApi>(*view_, *relay_, *store_, *js_, redis_.get(), *quotas_, counts_,
                                             SessionApi::Options{o_.cell, o_.max_streams_per_tenant});
    admin_ = std::make_unique<AdminApi>(*store_, *keys_, pools_.get());
    dashboard_ = std::make_unique<DashboardFeed>(*view_);
    view_->follow_round(0);
    return {};
}

void Gateway::announce(const std::string & name, const std::string & url) {
    name_ = name;
    url_ = url;
    keep_announced();
    follower_ = std::thread([this] { view_->follow(stop_); });
    dashboard_->start(name);
    watcher_ = std::thread([this] {
        while (!stop_.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
            keep_announced();
            keys_->refresh();
        }
    });
}

void Gateway::stop() {
    if (stop_.exchange(true)) return;
    if (watcher_.joinable()) watcher_.join();
    if (follower_.joinable()) follower_.join();
    if (dashboard_) dashboard_->stop();
    if (lease_ != 0) etcd_.revoke(lease_);  // the others' share of each quota grows at once
    if (pools_) pools_->stop();
}

void Gateway::reload() {
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
        auto rc = std::make_shared<routing::RoutingConfig>(cfg->routing);
        rc->tokenizer = cfg_.routing.tokenizer;
        std::lock_guard lk(routing_mu_);
        routing_ = std::move(rc);
    }
    spdlog::info("gateway: reload: {} pools, {} routes", cfg->routing.pools.size(), cfg->routing.routes.size());
}

void Gateway::handle(api::HttpRequest && req, std::shared_ptr<api::Responder> out) {
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
            auto tap = std::make_shared<StatusTap>(out, [this](int status) { counts_.answered(status); });
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
            const obs::LogScope log_scope(
                session, span ? std::optional(span->context()) : obs::TraceContext::parse(req.header("traceparent")));
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
        ++counts_.refused_workers;
        counts_.answered(503);
        send_error(client, 503, "the gateway is at its limit of requests in progress; retry shortly", 1, "overloaded");
    } catch (const std::exception & e) {
        // No thread could be started (the process is at its limit): the client hears so.
        --in_flight_;
        spdlog::error("gateway: no worker thread for a request: {}", e.what());
        counts_.answered(503);
        send_error(client, 503, "the gateway is overloaded; retry shortly", 1, "overloaded");
    }
}

void Gateway::keep_announced() {
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

void Gateway::route(api::HttpRequest & req, const std::shared_ptr<api::Responder> & out) {
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
    if (p == "/readyz") return readyz(out);
    // A browser opens the dashboard with HTTP Basic credentials (the password is the API key):
    // they come with its event stream too, which cannot carry a header of its own.
    const bool dashboard = p == "/dashboard" || p.rfind("/dashboard/", 0) == 0;
    if (dashboard) basic_as_bearer(req);
    if (!keys_->ready()) {
        // Without keys of its own, whether callers need one depends on PostgreSQL's.
        send_error(out, 503, "the gateway has not read its tenants and keys from PostgreSQL yet; retry shortly", 2,
                   "store_unavailable");
        return;
    }
    auto authed = keys_->authenticate(req);
    if (authed && authed->bad_tenant) {
        send_error(out, 400,
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
        send_error(out, 401, "missing or invalid API key; send 'Authorization: Bearer <key>'", 0, "invalid_api_key");
        return;
    }
    const api::Caller & caller = authed->caller;
    if (p == "/metrics") {
        if (!caller.admin) return send_error(out, 403, "/metrics needs an admin key");
        out->send(200, "text/plain; version=0.0.4", render_metrics());
        return;
    }
    if (dashboard) return dashboard_->route(req, out, caller);
    const auto parts = split_path(p);
    if (!parts.empty() && parts[0] == "admin") return admin_->route(req, out, caller, parts);
    keys_->rewrite_identity(req, *authed);
    // As on a node: requests that start work count, reads (GET, event streams) and deletes do not.
    if (req.method == "POST") {
        // The tenant's quotas (PostgreSQL), then a key's own (--api-key-file), all shared.
        if (auto r = kv_held(*authed)) return refuse(out, caller, *r, counts_);
        if (auto r = quotas_->request(caller.tenant, authed->quota.rpm)) return refuse(out, caller, *r, counts_);
        const auto * key = authed->file_key;
        if (key && key->limits && key->limits->requests_per_min > 0) {
            if (auto r =
                    quotas_->request(caller.tenant + ":acct:" + caller.account, int64_t(key->limits->requests_per_min)))
                return refuse(out, caller, *r, counts_);
        }
    } else if (!caller.admin && o_.reads_per_minute > 0) {
        // Reads start no work, but each holds a worker and reaches a node or the store: a key
        // has a budget of its own for them.
        if (auto r = quotas_->request(caller.tenant + ":reads:" + caller.account, o_.reads_per_minute)) {
            r->quota = "reads_per_minute";
            return refuse(out, caller, *r, counts_);
        }
    }
    ++counts_.requests;
    if (parts.size() == 4 && parts[0] == "v1" && parts[1] == "agents" && parts[3] == "sessions" && req.method == "POST")
        return sessions_->create(req, out, *authed, parts[2]);
    if (parts.size() >= 3 && parts[0] == "v1" && parts[1] == "sessions")
        return sessions_->route(req, out, caller, parts[2], parts.size() == 4 ? parts[3] : std::string());
    generate_or_relay(req, out, *authed);
}

void Gateway::readyz(const std::shared_ptr<api::Responder> & out) {
    const auto r = view_->readiness();
    if (r.nodes == 0) return send_error(out, 503, "no node has joined the cluster yet");
    json j{{"status", "ready"}, {"nodes", r.nodes}, {"cell_weights", r.weights}, {"full_cells", r.full}};
    if (pools_) j["pools"] = pools_->status(false);
    out->send(200, "application/json", j.dump());
}

std::optional<cluster::QuotaRefusal> Gateway::kv_held(const Authed & a) {
    if (a.quota.kv_bytes <= 0) return std::nullopt;
    if (view_->kv_held(a.caller.tenant) < a.quota.kv_bytes) return std::nullopt;
    return cluster::QuotaRefusal{"kv_bytes", a.quota.kv_bytes, 5, false};
}

void Gateway::generate_or_relay(api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                                const Authed & authed) {
    const api::Caller & caller = authed.caller;
    const std::string & p = req.path;
    const bool generates =
        req.method == "POST" && (p == "/v1/chat/completions" || p == "/v1/completions" || p == "/v1/responses");
    Tokens tokens;
    if (generates && authed.quota.tpm > 0) {
        int64_t prompt = 0;
        const int64_t estimate = estimate_tokens(req.body, prompt);
        if (auto r = quotas_->reserve_tokens(caller.tenant, authed.quota.tpm, estimate, tokens.hold))
            return refuse(out, caller, *r, counts_);
        tokens.tenant = caller.tenant;
        tokens.prompt = prompt;
    }
    // A key's own tokens per minute (--api-key-file tpm=): a node counts what it serves, but
    // a pool's tokens pass no node, so the gateways count them too, shared as the rpm is.
    Tokens key_tokens;
    if (const auto * key = authed.file_key;
        generates && pools_ && key && key->limits && key->limits->tokens_per_min > 0) {
        int64_t prompt = 0;
        const int64_t estimate = estimate_tokens(req.body, prompt);
        const std::string bucket = caller.tenant + ":acct:" + caller.account;
        if (auto r = quotas_->reserve_tokens(bucket, int64_t(key->limits->tokens_per_min), estimate, key_tokens.hold)) {
            if (!tokens.tenant.empty()) quotas_->settle_tokens(tokens.tenant, tokens.hold, 0);
            return refuse(out, caller, *r, counts_);
        }
        key_tokens.tenant = bucket;
        key_tokens.prompt = prompt;
    }
    if (pools_ && req.method == "POST" && (p == "/v1/chat/completions" || p == "/v1/completions"))
        generations_->route(req, out, caller, &tokens.scan);
    else if (p == "/v1/chat/completions" && req.method == "POST")
        relay_->by_load(req, out, affinity_->node_for(req, caller), &tokens.scan);
    else
        relay_->by_load(req, out, std::nullopt, &tokens.scan);
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

std::shared_ptr<const routing::RoutingConfig> Gateway::routing() {
    std::lock_guard lk(routing_mu_);
    return routing_;
}

}  // namespace armada::gateway

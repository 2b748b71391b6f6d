#pragma once

#include "api/auth.h"
#include "api/http_server.h"
#include "api/openai_service.h"
#include "api/rate_limit.h"
#include "api/responses_service.h"
#include "api/sessions_api.h"
#include "obs/metrics.h"

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>

namespace armada::api {

//! Kubernetes-style probes. `live` says whether the process's loops turn; `ready` calls back
//! with whether the node takes traffic now, and why not.
struct Probes {
    std::function<std::string()> live;                            // "" when alive, else what is stuck
    std::function<void(std::function<void(std::string)>)> ready;  // "" when ready, else why not
};

//! Maps routes to handlers, checks API keys, counts requests, and is the one place where
//! exceptions from handlers become HTTP errors (ApiError → its 4xx, anything else → 500).
class Router {
  public:
    //! `limits` may be null: no rate limits.
    Router(ApiKeys keys, obs::Registry & metrics, RateLimiter * limits = nullptr);

    //! Set once the model and engines are ready; until then every route but the probes is 503.
    void set_service(OpenAIService * svc, const engine::EngineSet * engines, SessionsApi * sessions = nullptr,
                     ResponsesService * responses = nullptr);
    void set_probes(Probes p) {
        std::lock_guard lk(probes_mu_);
        probes_ = std::move(p);
    }
    //! Adds gauges and counters that something else owns (the store's connection pools), brought
    //! up to date each time /metrics is read. Call before serving.
    void add_metrics_source(std::function<void(obs::Registry &)> f) { metric_sources_.push_back(std::move(f)); }
    //! Adds metrics something else renders itself (Prometheus text, appended to /metrics). It must
    //! outlive the listeners.
    void add_metrics_text(std::function<std::string()> f) {
        std::lock_guard lk(texts_mu_);
        metric_texts_.push_back(std::move(f));
    }
    //! From now on new requests get 503 with Retry-After; the probes and /metrics still answer.
    void set_draining() { draining_.store(true); }
    //! What `POST /admin/drain` starts (the node's own drain, as SIGTERM would); unset: the
    //! route answers 501.
    void set_drain_request(std::function<void()> f) {
        std::lock_guard lk(probes_mu_);
        drain_request_ = std::move(f);
    }
    //! GET /admin/kv/{session} (admin; cluster nodes fetch a moving session's KV journal):
    //! answers through the responder, throwing ApiError when it cannot. Unset: 404. It answers
    //! while the node drains, which is when sessions move away.
    using KvSender = std::function<void(const std::string & session, std::shared_ptr<Responder> out)>;
    void set_kv_sender(KvSender f) {
        std::lock_guard lk(probes_mu_);
        kv_sender_ = std::move(f);
    }
    //! The cluster's peer key (ARMADA_PEER_KEY, the same on every node): it opens
    //! /admin/kv/{session}, as an admin key does. A node with no API keys and no peer key
    //! refuses that route: another node's KV journal is never served to anyone who asks. Set
    //! before serving.
    void set_peer_key(std::string k) { peer_key_ = std::move(k); }
    //! Answers with 500, 502 or 504 since start (503, sent by drains and overload, is not one).
    int64_t server_errors() const { return server_errors_.load(); }
    bool draining() const { return draining_.load(); }
    void dispatch(HttpRequest && req, std::shared_ptr<Responder> out);
    //! The metrics listener (`--metrics-port`): /metrics without a key, and the probes.
    void dispatch_metrics(HttpRequest && req, std::shared_ptr<Responder> out);

  private:
    void route(HttpRequest & req, const std::shared_ptr<Responder> & out, std::string & route_name);
    //! GET /admin/kv/{session}, with its own check: the peer key, or an admin key.
    void send_kv(const HttpRequest & req, const std::shared_ptr<Responder> & out, std::string & route_name);
    std::string peer_key_;
    //! /health, /livez, /readyz; true when `req` was one of them.
    bool probe(const HttpRequest & req, const std::shared_ptr<Responder> & out, std::string & route_name);
    void count(const std::string & route, int code);
    //! Refuses with 429 when the key is over its requests or tokens per minute.
    void check_rate(const HttpRequest & req, const std::string & account);
    std::string render_metrics();
    std::string render_registry();
    std::vector<std::function<void(obs::Registry &)>> metric_sources_;
    std::mutex texts_mu_;
    std::vector<std::function<std::string()>> metric_texts_;  // texts_mu_
    //! The prompt cache over every engine (GET /v1/cache, /metrics).
    struct CacheTotals {
        bool enabled = false;
        uint64_t lookups = 0, hits = 0, tokens_saved = 0, saves = 0, evictions = 0, restored = 0, copied = 0;
        uint64_t ram_entries = 0, disk_entries = 0, ram_bytes = 0, disk_bytes = 0;
    };
    CacheTotals cache_totals() const;
    std::string cache_json() const;
    template <class F>
    void guarded(HttpRequest & req, const std::shared_ptr<Responder> & out, F && f);

    ApiKeys keys_;
    obs::Registry & metrics_;
    RateLimiter * limits_;
    std::atomic<OpenAIService *> svc_{nullptr};
    std::atomic<const engine::EngineSet *> engines_{nullptr};
    std::atomic<SessionsApi *> sessions_{nullptr};
    std::atomic<ResponsesService *> responses_{nullptr};
    std::mutex probes_mu_;
    Probes probes_;                        // guarded by probes_mu_ (set while I/O threads already answer)
    std::function<void()> drain_request_;  // guarded by probes_mu_
    KvSender kv_sender_;                   // guarded by probes_mu_
    std::atomic<bool> draining_{false};
    std::atomic<int64_t> server_errors_{0};  // server_errors()
};

}  // namespace armada::api

#include "api/router.h"

#include "api/errors.h"
#include "api/openapi.h"

#include <spdlog/spdlog.h>

namespace armada::api {

Router::Router(ApiKeys keys, obs::Registry & metrics, RateLimiter * limits)
    : keys_(std::move(keys)), metrics_(metrics), limits_(limits) {}

void Router::check_rate(const HttpRequest & req, const std::string & account) {
    // Requests that start work count; reading state (GET, SSE replays) and deleting do not.
    if (!limits_ || !limits_->enabled() || req.method != "POST") return;
    const auto d = limits_->admit(account);
    if (d.ok) return;
    metrics_.counter("armada_rate_limited_total", "Requests refused by a key's rate limit", {{"limit", d.which}}).inc();
    char msg[160];
    snprintf(msg, sizeof msg, "rate limit reached for %s per minute (limit %.0f); retry after %.0f s", d.which, d.limit,
             d.retry_after_s);
    ApiError e(429, msg, {}, "rate_limit_exceeded");
    e.retry_after_s = int(d.retry_after_s);
    throw e;
}

void Router::set_service(OpenAIService * svc, const engine::EngineSet * engines, SessionsApi * sessions,
                         ResponsesService * responses) {
    engines_.store(engines);
    sessions_.store(sessions);
    responses_.store(responses);
    svc_.store(svc);
}

void Router::count(const std::string & route, int code) {
    if (code == 500 || code == 502 || code == 504) server_errors_++;
    metrics_
        .counter("armada_requests_total", "HTTP requests by route and status",
                 {{"route", route}, {"code", std::to_string(code)}})
        .inc();
}

Router::CacheTotals Router::cache_totals() const {
    CacheTotals t;
    const auto * set = engines_.load();
    if (!set) return t;
    for (size_t i = 0; i < set->size(); ++i) {
        const auto & e = set->at(i);
        const auto * c = e.prefix_cache();
        if (!c) continue;
        t.enabled = true;
        t.lookups += c->lookups.load();
        t.hits += c->hits.load();
        t.tokens_saved += c->tokens_saved.load();
        t.saves += c->inserts.load();
        t.restored += c->restored.load();
        t.copied += c->copied.load();
        const auto p = e.pool().stats();
        t.ram_entries += p.cache_ram_entries;
        t.disk_entries += p.cache_disk_entries;
        t.ram_bytes += p.cache_ram_bytes;
        t.disk_bytes += p.cache_disk_bytes;
        t.evictions += p.cache_evicted;
    }
    return t;
}

std::string Router::cache_json() const {
    const CacheTotals t = cache_totals();
    const double rate = t.lookups ? double(t.hits) / double(t.lookups) : 0.0;
    return dump(json{{"object", "prompt_cache"},
                     {"enabled", t.enabled},
                     {"block_tokens", engine::PrefixCache::kBlock},
                     {"requests", t.lookups},
                     {"hits", t.hits},
                     {"hit_rate", rate},
                     {"tokens_saved", t.tokens_saved},
                     {"saves", t.saves},
                     {"restored_from_entries", t.restored},
                     {"copied_from_sequences", t.copied},
                     {"evictions", t.evictions},
                     {"entries", {{"ram", t.ram_entries}, {"disk", t.disk_entries}}},
                     {"bytes", {{"ram", t.ram_bytes}, {"disk", t.disk_bytes}}}});
}

std::string Router::render_metrics() {
    std::string out = render_registry();
    std::lock_guard lk(texts_mu_);
    for (auto & f : metric_texts_)
        out += f();
    return out;
}

std::string Router::render_registry() {
    for (auto & f : metric_sources_)
        f(metrics_);
    const auto * set = engines_.load();
    if (!set) return metrics_.render();
    // Node totals over every engine, then a few gauges per engine.
    int64_t active = 0, queued = 0;
    double kv_used = 0, budget = 0;
    uint64_t parks = 0, r_ram = 0, r_disk = 0, r_journal = 0, r_fail = 0, prefix_hits = 0, journal_ns = 0;
    engine::KvPoolStats ps{};
    engine::KvJournalStats js{};
    bool journal = false, pressure = set->kv_pressure();
    for (size_t i = 0; i < set->size(); ++i) {
        const auto & e = set->at(i);
        const auto & st = e.stats();
        active += st.active.load();
        queued += st.queued.load();
        kv_used += double(st.kv_cells_used.load()) * double(e.kv_bytes_per_cell());
        budget += double(e.kv_budget());
        parks += st.parks.load();
        r_ram += st.restores_ram.load();
        r_disk += st.restores_disk.load();
        r_journal += st.restores_journal.load();
        r_fail += st.restore_failures.load();
        prefix_hits += st.prefix_hits.load();
        journal_ns += st.journal_ns.load();
        const auto p = e.pool().stats();
        ps.ram_bytes += p.ram_bytes;
        ps.disk_bytes += p.disk_bytes;
        ps.ram_entries += p.ram_entries;
        ps.disk_entries += p.disk_entries;
        ps.spilled += p.spilled;
        ps.dropped += p.dropped;
        if (const auto * j = e.journal()) {
            const auto s = j->stats();
            journal = true;
            js.records += s.records;
            js.bytes_written += s.bytes_written;
            js.skipped += s.skipped;
            js.failed += s.failed;
        }
        const obs::Labels l{{"engine", std::to_string(i)}};
        metrics_.gauge("armada_engine_sequences_active", "Sequences being decoded, per engine", l)
            .set(st.active.load());
        metrics_.gauge("armada_engine_sequences_queued", "Requests waiting for a sequence, per engine", l)
            .set(st.queued.load());
        metrics_.sync_counter("armada_engine_requests_total", "Requests each engine accepted", st.requests.load(), l);
        metrics_
            .gauge("armada_engine_programs",
                   "Programs (agent sessions, Responses chains, conversations) the scheduler keeps an account of, "
                   "per engine",
                   l)
            .set(double(st.programs.load()));
    }
    metrics_.gauge("armada_engines", "Engine instances on this node").set(double(set->size()));
    metrics_.gauge("armada_sequences_active", "Sequences being decoded").set(double(active));
    metrics_.gauge("armada_sequences_queued", "Requests waiting for a sequence").set(double(queued));
    metrics_.gauge("armada_kv_bytes_used", "KV cache bytes holding tokens").set(kv_used);
    // Session memory: the engines keep running totals; counters catch up with them here.
    auto sync = [this](const char * name, const char * help, uint64_t v, const obs::Labels & l = {}) {
        metrics_.sync_counter(name, help, v, l);
    };
    metrics_.gauge("armada_kv_budget_bytes", "KV memory budget of the node (context + parked in RAM)").set(budget);
    metrics_.gauge("armada_kv_parked_bytes", "Parked KV bytes by tier", {{"tier", "ram"}}).set(double(ps.ram_bytes));
    metrics_.gauge("armada_kv_parked_bytes", "", {{"tier", "disk"}}).set(double(ps.disk_bytes));
    metrics_
        .gauge("armada_kv_parked_entries", "Parked KV entries (sessions and shared prefixes) by tier",
               {{"tier", "ram"}})
        .set(double(ps.ram_entries));
    metrics_.gauge("armada_kv_parked_entries", "", {{"tier", "disk"}}).set(double(ps.disk_entries));
    metrics_.gauge("armada_kv_pressure", "1 while new sessions are refused at the KV high watermark")
        .set(pressure ? 1 : 0);
    sync("armada_kv_parks_total", "Sequences saved into the KV pool", parks);
    sync("armada_kv_restores_total", "Sequences restored from the KV pool", r_ram, {{"from", "ram"}});
    sync("armada_kv_restores_total", "", r_disk, {{"from", "disk"}});
    sync("armada_kv_restores_total", "", r_journal, {{"from", "journal"}});
    sync("armada_kv_restore_failures_total", "Restores refused or failed (the session re-prefilled)", r_fail);
    sync("armada_kv_prefix_hits_total",
         "Requests started from KV another request computed (a cache entry or a live sequence)", prefix_hits);
    sync("armada_kv_spills_total", "Parked KV entries written to disk", ps.spilled);
    sync("armada_kv_dropped_total", "Parked KV entries dropped for lack of room", ps.dropped);
    if (const CacheTotals t = cache_totals(); t.enabled) {
        sync("armada_prompt_cache_requests_total", "Generation requests the prompt cache saw", t.lookups);
        sync("armada_prompt_cache_hits_total", "Requests that reused at least one cached block of their prompt",
             t.hits);
        sync("armada_prompt_cache_tokens_saved_total", "Prompt tokens reused instead of computed", t.tokens_saved);
        sync("armada_prompt_cache_evictions_total", "Prompt-cache entries evicted for room", t.evictions);
        sync("armada_prompt_cache_restores_total", "Requests that restored a prompt-cache entry", t.restored);
        sync("armada_prompt_cache_copies_total", "Requests that copied their prefix from another sequence", t.copied);
        metrics_.gauge("armada_prompt_cache_hit_ratio", "Hits over requests since start")
            .set(t.lookups ? double(t.hits) / double(t.lookups) : 0.0);
        metrics_.gauge("armada_prompt_cache_entries", "Prompt-cache entries by tier", {{"tier", "ram"}})
            .set(double(t.ram_entries));
        metrics_.gauge("armada_prompt_cache_entries", "", {{"tier", "disk"}}).set(double(t.disk_entries));
        metrics_.gauge("armada_prompt_cache_bytes", "Prompt-cache bytes by tier", {{"tier", "ram"}})
            .set(double(t.ram_bytes));
        metrics_.gauge("armada_prompt_cache_bytes", "", {{"tier", "disk"}}).set(double(t.disk_bytes));
    }
    if (journal) {
        sync("armada_kv_journal_records_total", "Steps appended to session KV journals", js.records);
        sync("armada_kv_journal_bytes_total", "Bytes written to session KV journals", js.bytes_written);
        sync("armada_kv_journal_skipped_total", "Steps not journaled because the writer was behind", js.skipped);
        sync("armada_kv_journal_failures_total", "Journal writes that failed", js.failed);
        metrics_.gauge("armada_kv_journal_save_seconds", "Engine-thread time spent saving state for journals")
            .set(double(journal_ns) / 1e9);
    }
    return metrics_.render();
}

namespace {
bool is_json_type(const std::string & ct) {
    return ct.empty() || ct.rfind("application/json", 0) == 0 || ct.find("+json") != std::string::npos;
}
}  // namespace

bool Router::probe(const HttpRequest & req, const std::shared_ptr<Responder> & out, std::string & route_name) {
    const std::string & p = req.path;
    if (p != "/health" && p != "/livez" && p != "/readyz") return false;
    route_name = p;
    if (req.method != "GET") throw ApiError(405, "use GET for " + p);
    Probes probes;
    {
        std::lock_guard lk(probes_mu_);
        probes = probes_;
    }
    auto answer = [this, out, route_name](const std::string & why, const char * ok_status) {
        const bool ok = why.empty();
        const json body = ok ? json{{"status", ok_status}} : json{{"status", "unavailable"}, {"reason", why}};
        out->send(ok ? 200 : 503, "application/json", dump(body), ok ? Headers{} : Headers{{"Retry-After", "1"}});
        count(route_name, ok ? 200 : 503);
    };
    if (p == "/health") {
        // llama-server's meaning: 200 once the model is loaded, 503 while loading.
        answer(svc_.load() ? "" : "loading", "ok");
    } else if (p == "/livez") {
        answer(probes.live ? probes.live() : "", "alive");
    } else if (!svc_.load()) {
        answer("the model is loading", "ready");
    } else if (draining_.load()) {
        answer("draining", "ready");
    } else if (probes.ready) {
        probes.ready([answer](const std::string & why) { answer(why, "ready"); });
    } else {
        answer("", "ready");
    }
    return true;
}

void Router::send_kv(const HttpRequest & req, const std::shared_ptr<Responder> & out, std::string & route_name) {
    route_name = "/admin/kv/{session}";
    // Inside a cluster, nodes fetch a moving session's KV with the cluster's peer key; an
    // operator may use an admin key. Without either kind of key nothing opens it.
    std::string bearer = req.header("authorization");
    bearer = bearer.rfind("Bearer ", 0) == 0 ? bearer.substr(7) : std::string();
    bool ok = !peer_key_.empty() && constant_time_equal(bearer, peer_key_);
    if (!ok && keys_.enabled()) {
        const ApiKeys::Key * key = keys_.check(req.header("authorization"), req.header("x-api-key"));
        ok = key && keys_.caller(key).admin;
        if (!ok && key)
            throw ApiError(403, "/admin/kv needs the cluster's peer key or an admin key", {}, "permission_denied");
    }
    if (!ok) {
        if (peer_key_.empty() && !keys_.enabled())
            throw ApiError(403,
                           "/admin/kv is closed: this node has no API keys and no peer key; set ARMADA_PEER_KEY, the "
                           "same on every node of the cluster, so that nodes can move sessions with their KV",
                           {}, "permission_denied");
        throw ApiError(401, "/admin/kv needs 'Authorization: Bearer <the cluster's peer key or an admin key>'", {},
                       "invalid_api_key");
    }
    if (req.method != "GET") throw ApiError(405, "use GET for /admin/kv/{session}");
    KvSender send;
    {
        std::lock_guard lk(probes_mu_);
        send = kv_sender_;
    }
    const std::string id = req.path.substr(10);
    if (!send || id.empty() || id.find('/') != std::string::npos) throw ApiError(404, "no such route", {}, "not_found");
    send(id, out);
    count(route_name, 200);
}

void Router::route(HttpRequest & req, const std::shared_ptr<Responder> & out, std::string & route_name) {
    const std::string & p = req.path;
    const bool get = req.method == "GET", post = req.method == "POST";
    if (probe(req, out, route_name)) return;
    if (p.rfind("/admin/kv/", 0) == 0) return send_kv(req, out, route_name);
    if (p == "/openapi.json") {
        // The contract is public, as a client library's is: no key needed.
        route_name = p;
        if (!get) throw ApiError(405, "use GET for /openapi.json");
        out->send(200, "application/json", std::string(openapi_document()));
        count(route_name, 200);
        return;
    }
    const ApiKeys::Key * key =
        keys_.enabled() ? keys_.check(req.header("authorization"), req.header("x-api-key")) : nullptr;
    if (keys_.enabled() && !key) {
        route_name = "auth";
        throw ApiError(401, "missing or invalid API key; send 'Authorization: Bearer <key>'", {}, "invalid_api_key");
    }
    Caller caller = keys_.caller(key);
    if (caller.admin) {
        // A gateway forwarding for a tenant whose key it checked (tenants in PostgreSQL).
        if (const std::string as = req.header("x-armada-tenant"); !as.empty()) {
            auto acting = acting_as(as);
            if (!acting) {
                route_name = "auth";
                throw ApiError(400,
                               "X-Armada-Tenant must be 't:NAME' with a tenant name of 1 to 64 letters, digits, "
                               "'_', '-' or '.'");
            }
            caller = std::move(*acting);
        }
    }
    if (p == "/metrics") {
        route_name = p;
        if (!get) throw ApiError(405, "use GET for /metrics");
        // Metrics name every tenant's tools and load: on the main port they need an admin key.
        // Prometheus scrapes the metrics listener (--metrics-port) instead.
        if (!caller.admin)
            throw ApiError(403, "/metrics needs an admin key; scrape the metrics listener (--metrics-port) instead");
        out->send(200, "text/plain; version=0.0.4", render_metrics());
        count(route_name, 200);
        return;
    }
    if (p == "/v1/cache") {
        route_name = p;
        if (!get) throw ApiError(405, "use GET for /v1/cache");
        // Node-wide figures over every tenant: an operator's view.
        if (!caller.admin) throw ApiError(403, "/v1/cache needs an admin key", {}, "permission_denied");
        out->send(200, "application/json", cache_json());
        count(route_name, 200);
        return;
    }
    if (p == "/admin/drain") {
        route_name = p;
        if (req.method != "POST") throw ApiError(405, "use POST for /admin/drain");
        if (!caller.admin) throw ApiError(403, "/admin/drain needs an admin key", {}, "permission_denied");
        std::function<void()> start;
        {
            std::lock_guard lk(probes_mu_);
            start = drain_request_;
        }
        if (!start) throw ApiError(501, "this server cannot be drained over HTTP; send it SIGTERM");
        // Asked again while draining: the same answer, nothing new starts.
        const bool already = draining_.load();
        if (!already) start();
        out->send(202, "application/json",
                  std::string(R"({"status":"draining","already":)") + (already ? "true" : "false") + "}");
        count(route_name, 202);
        return;
    }
    if (draining_.load()) {
        route_name = "draining";
        ApiError e(503, "the node is shutting down (draining); retry on another node or after its restart", {},
                   "draining");
        e.retry_after_s = 5;
        throw e;
    }
    OpenAIService * svc = svc_.load();
    check_rate(req, caller.account);
    if (p.rfind("/v1/agents", 0) == 0 || p.rfind("/v1/sessions", 0) == 0) {
        route_name = "/v1/sessions";
        SessionsApi * sa = sessions_.load();
        if (!sa) {
            ApiError e(503, "the node is still loading", {}, "loading");
            e.retry_after_s = 1;
            throw e;
        }
        if ((req.method == "POST") && !req.body.empty() && !is_json_type(req.header("content-type")) &&
            p != "/v1/agents") {
            throw ApiError(415, "content type must be application/json");
        }
        if (sa->handle(req, caller, out, route_name)) {
            count(route_name, 200);
            return;
        }
    }
    if (p == "/v1/responses" || p.rfind("/v1/responses/", 0) == 0) {
        route_name = p == "/v1/responses" ? p : "/v1/responses/{id}";
        ResponsesService * rs = responses_.load();
        if (!rs) {
            ApiError e(503, "the node is still loading", {}, "loading");
            e.retry_after_s = 1;
            throw e;
        }
        if (p == "/v1/responses") {
            if (!post) throw ApiError(405, "use POST for /v1/responses");
            if (!is_json_type(req.header("content-type"))) throw ApiError(415, "content type must be application/json");
            rs->create(parse_request_body(req.body), caller, out, obs::TraceContext::parse(req.header("traceparent")));
        } else {
            const std::string id = p.substr(std::string("/v1/responses/").size());
            if (req.method == "GET")
                rs->get(id, caller.tenant, out);
            else if (req.method == "DELETE")
                rs->erase(id, caller.tenant, out);
            else
                throw ApiError(405, "use GET or DELETE for a stored response");
        }
        count(route_name, 200);
        return;
    }
    const bool known = p == "/v1/models" || p == "/v1/chat/completions" || p == "/v1/completions";
    if (!known) {
        route_name = "other";
        throw ApiError(404, "no route for " + req.method + " " + p, {}, "not_found");
    }
    route_name = p;
    if (!svc) {
        ApiError e(503, "the model is still loading", {}, "loading");
        e.retry_after_s = 1;
        throw e;
    }
    if (p == "/v1/models") {
        if (!get) throw ApiError(405, "use GET for /v1/models");
        out->send(200, "application/json", dump(svc->models()));
        count(route_name, 200);
        return;
    }
    if (!post) throw ApiError(405, "use POST for " + p);
    if (!is_json_type(req.header("content-type"))) {
        throw ApiError(415, "content type must be application/json");
    }
    const json body = parse_request_body(req.body);
    if (p == "/v1/chat/completions") {
        svc->chat(body, caller.account, caller.tenant, out, req.header("x-armada-session"));
    } else {
        svc->completion(body, caller.account, caller.tenant, out, req.header("x-armada-session"));
    }
}

template <class F>
void Router::guarded(HttpRequest & req, const std::shared_ptr<Responder> & out, F && f) {
    std::string route_name = "other";
    try {
        f(route_name);
    } catch (const ApiError & e) {
        Headers h;
        if (e.retry_after_s > 0) h.emplace_back("Retry-After", std::to_string(e.retry_after_s));
        if (e.status == 401) h.emplace_back("WWW-Authenticate", "Bearer");
        out->send(e.status, "application/json", error_body(e.status, e.what(), e.param, e.code), h);
        count(route_name, e.status);
    } catch (const engine::ContextOverflow & e) {
        out->send(400, "application/json", error_body(400, e.what(), "messages", "context_length_exceeded"));
        count(route_name, 400);
    } catch (const std::invalid_argument & e) {
        // Lower rooms report what the client got wrong as invalid_argument.
        out->send(400, "application/json", error_body(400, e.what()));
        count(route_name, 400);
    } catch (const std::exception & e) {
        spdlog::error("{} {}: {}", req.method, req.path, e.what());
        out->send(500, "application/json", error_body(500, "internal error"));
        count(route_name, 500);
    }
}

void Router::dispatch(HttpRequest && req, std::shared_ptr<Responder> out) {
    guarded(req, out, [&](std::string & route_name) { route(req, out, route_name); });
}

void Router::dispatch_metrics(HttpRequest && req, std::shared_ptr<Responder> out) {
    guarded(req, out, [&](std::string & route_name) {
        if (probe(req, out, route_name)) return;
        if (req.path != "/metrics") throw ApiError(404, "the metrics listener serves /metrics and the probes only");
        route_name = "/metrics";
        if (req.method != "GET") throw ApiError(405, "use GET for /metrics");
        out->send(200, "text/plain; version=0.0.4", render_metrics());
        count(route_name, 200);
    });
}

}  // namespace armada::api

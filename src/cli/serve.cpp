#include "cli/serve.h"

#include "common/cli_exit.h"
#include "common/clock.h"
#include "common/stop_signals.h"

#include "cli/cluster_node.h"
#include "cli/kv_move.h"

#include "agent/session_manager.h"
#include "api/openai_service.h"
#include "api/readiness.h"
#include "api/router.h"
#include "api/sessions_api.h"
#include "cluster/quota.h"
#include "cluster/redis.h"
#include "engine/engine_set.h"
#include "engine/memory_budget.h"
#include "engine/model.h"
#include "net/tls.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "routing/pool_set.h"
#include "routing/pool_steps.h"
#include "routing/upstream.h"
#include "store/cluster_store.h"
#include "store/crash_point.h"
#include "store/open.h"
#include "tools/client_calls.h"
#include "tools/http_tool.h"
#include "tools/mcp_client.h"
#include "tools/tenant_gate.h"

#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include <pthread.h>
#include <sys/resource.h>
#include <csignal>
#include <cstdio>

namespace armada::cli {

namespace {
void llama_log_quiet(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}
//! With JSON logs, llama.cpp's lines become log lines too (it writes some in pieces: they are
//! joined up to the newline). `quiet` (non-null): its errors only.
void llama_log_to_spdlog(ggml_log_level level, const char * text, void * quiet) {
    thread_local std::string line;
    thread_local ggml_log_level first = GGML_LOG_LEVEL_NONE;
    if (line.empty()) first = level;
    line += text;
    if (line.empty() || line.back() != '\n') return;
    line.pop_back();
    if (first >= GGML_LOG_LEVEL_ERROR)
        spdlog::error("llama.cpp: {}", line);
    else if (quiet == nullptr)
        spdlog::log(first == GGML_LOG_LEVEL_WARN ? spdlog::level::warn : spdlog::level::debug, "llama.cpp: {}", line);
    line.clear();
}
}  // namespace

int serve(const ServeOptions & opt) {
    // Each client connection is a file descriptor: take the hard limit, not the default 1024.
    if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    const sigset_t stop_set = common::block_stop_signals();
    // SIGHUP reads the GPU pools again (and must not end the node, its default action).
    sigset_t wait_set = stop_set;
    sigaddset(&wait_set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &wait_set, nullptr);
    spdlog::set_level(spdlog::level::from_str(opt.log_level));
    if (obs::json_logs())
        llama_log_set(llama_log_to_spdlog, opt.log_level != "debug" ? reinterpret_cast<void *>(1) : nullptr);
    else if (opt.log_level != "debug")
        llama_log_set(llama_log_quiet, nullptr);
    if (opt.model.empty()) {
        return common::fail("no model given; use -m FILE or ARMADA_MODEL", 2);
    }
    api::ApiKeys keys;
    if (auto err = keys.load_flags(opt.api_key, opt.api_key_file); !err.empty()) {
        return common::fail(err, 2);
    }
    if (opt.http.host != "127.0.0.1" && opt.http.host != "localhost" && opt.http.host != "::1" && !keys.enabled()) {
        spdlog::warn("listening on {} without an API key; anyone who can reach it can use it", opt.http.host);
    }
    const auto ttl_ms = parse_duration_ms(opt.session_ttl);
    if (!ttl_ms) {
        return common::fail(
            fmt::format("--session-ttl '{}' is not a duration (e.g. 30d, 12h, 0 for forever)", opt.session_ttl), 2);
    }
    if (!(opt.drain_timeout_s >= 0)) {
        return common::fail("--drain-timeout must be 0 or more seconds", 2);
    }

    // Agents and tool settings are checked before the model loads, so a bad file fails fast.
    // Only this file, the operator's, may name secrets (${env:…}, ${file:…}).
    std::vector<agent::AgentSpec> agents;
    if (!opt.agents_file.empty()) {
        std::ifstream f(opt.agents_file);
        if (!f) {
            return common::fail(fmt::format("cannot read agents file {}", opt.agents_file), 2);
        }
        std::stringstream ss;
        ss << f.rdbuf();
        if (auto e = agent::parse_agents(ss.str(), agents, {.from_operator = true}); !e.empty()) {
            return common::fail(fmt::format("{}: {}", opt.agents_file, e), 2);
        }
    }
    tools::SsrfGuard guard;
    for (const auto & c : opt.tool_allow) {
        tools::Cidr cidr;
        if (!tools::parse_cidr(c, cidr)) {
            return common::fail(fmt::format("--tool-allow '{}' is not an address or CIDR range", c), 2);
        }
        guard.allow(cidr);
    }
    std::string tls_err;
    auto tool_tls = armada::net::client_tls(opt.tool_ca_file, tls_err);
    if (!tool_tls) {
        return common::fail(tls_err, 2);
    }
    engine::EngineConfig ecfg = opt.engine;
    if (!opt.kv_budget.empty()) {
        const auto v = engine::parse_size(opt.kv_budget);
        if (!v || *v == 0) {
            return common::fail(fmt::format("--kv-budget '{}' is not a size (e.g. 8G, 512M)", opt.kv_budget), 2);
        }
        ecfg.kv_budget = *v;
    }
    if (const auto v = engine::parse_size(opt.kv_disk)) {
        ecfg.kv_disk_limit = *v;
    } else {
        return common::fail(fmt::format("--kv-disk '{}' is not a size (e.g. 64G)", opt.kv_disk), 2);
    }
    for (const auto & [flag, name, type] : {std::tuple{"--cache-type-k", &opt.cache_type_k, &ecfg.type_k},
                                            std::tuple{"--cache-type-v", &opt.cache_type_v, &ecfg.type_v}}) {
        const auto t = engine::parse_cache_type(*name);
        if (!t) {
            return common::fail(
                fmt::format("{} '{}' is not one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1", flag,
                            name->c_str()),
                2);
        }
        *type = *t;
    }
    ecfg.park = !opt.no_park;
    ecfg.kv_journal = !opt.no_kv_journal;
    ecfg.prefix_cache = !opt.no_prefix_cache;
    if (ecfg.kv_dir.empty()) ecfg.kv_dir = opt.data_dir + "/kv";

    // Cluster mode: the cluster file names the servers; state lives in its PostgreSQL.
    std::optional<cluster::ClusterConfig> ccfg;
    std::shared_ptr<boost::asio::ssl::context> node_tls;  // credentials: nodes:, when it names a CA
    std::string node_name = opt.node_name;
    if (!opt.cluster_file.empty()) {
        std::string cerr;
        ccfg = cluster::load_cluster_config(opt.cluster_file, cerr);
        if (!ccfg) {
            return common::fail(fmt::format("--cluster {}: {}", opt.cluster_file, cerr), 2);
        }
        if (!cluster::valid_cell_or_node_name(opt.cell)) {
            return common::fail("--cluster needs --cell NAME (1..63 of A-Z a-z 0-9 . _ -)", 2);
        }
        // Other nodes (their KV) and pools over HTTPS are checked against the cluster's CA too.
        if (ccfg->nodes_auth.tls()) {
            std::string terr;
            node_tls = cluster::service_tls(ccfg->nodes_auth, "credentials.nodes", terr);
            if (!node_tls) {
                return common::fail(fmt::format("--cluster {}: {}", opt.cluster_file, terr), 2);
            }
            routing::set_upstream_tls(node_tls);
        }
        if (node_name.empty()) {
            char host[256] = {};
            gethostname(host, sizeof host - 1);
            node_name = std::string(host) + "-" + std::to_string(opt.http.port);
        }
        if (!cluster::valid_cell_or_node_name(node_name)) {
            return common::fail(fmt::format("--node-name '{}' must be 1..63 of A-Z a-z 0-9 . _ -", node_name), 2);
        }
        if (ccfg->postgres.empty()) {
            return common::fail(fmt::format("--cluster {} names no postgres database", opt.cluster_file), 2);
        }
        if (!opt.state.empty())
            spdlog::warn("--state is ignored in cluster mode: state is in the cluster's PostgreSQL");
    } else if (!opt.cell.empty() || !opt.node_name.empty()) {
        return common::fail("--cell and --node-name need --cluster FILE", 2);
    }
    std::string store_err;
    std::unique_ptr<store::Store> store;
    if (ccfg) {
        store::PostgresConfig pc;
        pc.urls = ccfg->postgres;
        pc.read_connections = ccfg->pg_pool;
        store = store::open_cluster_store(pc, store_err);
    } else {
        store = store::open(opt.state, {opt.data_dir, opt.pg_pool}, store_err);
        if (!store && store::postgres_urls(opt.state).empty() && opt.state != "sqlite" && !opt.state.empty())
            store_err = "--state: " + store_err;
    }
    if (!store) {
        return common::fail(store_err);
    }
    // Test hook: die right after the N-th durable commit (tests/node/crash.test.mjs).
    store::Store * st = store.get();
    std::unique_ptr<store::CrashAfterCommits> crash_hook;
    if (const char * n = std::getenv("ARMADA_CRASH_AFTER_COMMITS"); n && std::atol(n) > 0) {
        crash_hook = std::make_unique<store::CrashAfterCommits>(*store, std::atol(n));
        st = crash_hook.get();
    }

    // Placement is checked before the model loads, so a bad --cpus fails fast.
    if (opt.numa_weights != "shared" && opt.numa_weights != "copy") {
        return common::fail(fmt::format("--numa-weights must be shared or copy, not '{}'", opt.numa_weights), 2);
    }
    std::vector<engine::EnginePlacement> placements;
    if (!opt.no_pin) {
        std::string perr;
        auto po = placement_options(opt.place, perr);
        auto topo = po ? engine::Topology::detect(perr) : std::nullopt;
        auto plan = topo ? engine::plan_placement(*topo, *po, perr) : std::nullopt;
        if (!plan) {
            return common::fail(fmt::format("placement: {}", perr), 2);
        }
        placements = plan->engines;
    } else {
        // Unpinned: the engines share the machine's threads (or -t) evenly, as the OS schedules them.
        if (opt.place.engines < 0 || opt.place.engines > 1024) {
            return common::fail("placement: --engines must be between 1 and 1024", 2);
        }
        placements.resize(size_t(std::max(1, opt.place.engines)));
    }
    const int n_engines = int(placements.size());
    // -np, -c, --queue, --kv-budget and --kv-disk are the node's totals, split evenly; every
    // engine has the same context per sequence.
    if (ecfg.n_seq_max < n_engines) {
        return common::fail(
            fmt::format("{} engines need at least {} parallel sequences (-np), one each", n_engines, n_engines), 2);
    }
    std::vector<engine::EngineConfig> configs;
    for (int i = 0; i < n_engines; ++i) {
        engine::EngineConfig c = ecfg;
        c.index = i;
        c.n_seq_max = ecfg.n_seq_max / n_engines + (i < ecfg.n_seq_max % n_engines ? 1 : 0);
        c.n_ctx = int32_t(int64_t(ecfg.n_ctx) * c.n_seq_max / ecfg.n_seq_max);
        c.queue_max = ecfg.queue_max / n_engines + (i < ecfg.queue_max % n_engines ? 1 : 0);
        c.kv_disk_limit = ecfg.kv_disk_limit / uint64_t(n_engines);
        if (c.kv_budget > 0) c.kv_budget = ecfg.kv_budget / uint64_t(n_engines);
        if (n_engines > 1) c.kv_dir = ecfg.kv_dir + "/e" + std::to_string(i);
        const auto & pl = placements[size_t(i)];
        c.cpus = pl.cpus;
        c.memory_node = pl.memory_node;
        if (opt.no_pin && n_engines > 1) {
            const int all =
                ecfg.n_threads > 0 ? ecfg.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
            c.n_threads = std::max(1, all / n_engines);
        }
        if (!c.cpus.empty()) {
            const auto used = c.n_threads > 0 && size_t(c.n_threads) < c.cpus.size()
                                  ? std::vector<int>(c.cpus.begin(), c.cpus.begin() + c.n_threads)
                                  : c.cpus;
            spdlog::info("placement: engine {} threads pinned to cpus {}, memory node {}", i,
                         engine::format_cpu_list(used),
                         c.memory_node >= 0 ? std::to_string(c.memory_node) : std::string("any"));
        }
        configs.push_back(std::move(c));
    }
    obs::Registry metrics;
    const auto trace_counts = obs::tracer()->count_in(metrics);  // released before `metrics` goes
    api::RateLimiter limiter({opt.rate_rpm, opt.rate_tpm});
    for (const auto & k : keys.keys()) {
        if (k.limits) limiter.set_limits(api::owner_of(k.key), *k.limits);
    }
    // A node fetching a moving session's KV from another shows the cluster's peer key
    // (ARMADA_PEER_KEY, the same on every node), and if refused the first admin key (nodes of a
    // cluster share their keys; a node from before peer keys knows only those).
    const char * peer_env = std::getenv("ARMADA_PEER_KEY");
    const std::string own_peer_key = peer_env ? peer_env : "";
    std::vector<std::string> peer_keys;
    if (!own_peer_key.empty()) peer_keys.push_back(own_peer_key);
    for (const auto & k : keys.keys()) {
        if (k.admin) {
            peer_keys.push_back(k.key);
            break;
        }
    }
    if (ccfg && peer_keys.empty())
        spdlog::warn(
            "cluster: this node has no API keys and no ARMADA_PEER_KEY, so it serves no session's KV to "
            "another node: sessions that move from here re-prefill; set ARMADA_PEER_KEY, the same on every "
            "node");
    api::Router router(std::move(keys), metrics, &limiter);
    router.set_peer_key(own_peer_key);
    if (store->pool_stats()) {
        // PostgreSQL's read pools.
        router.add_metrics_source([s = store.get()](obs::Registry & m) {
            if (const auto p = s->pool_stats()) obs::pool_metrics(m, "armada_store_pool", *p);
        });
    }
    // The node's Redis pool (cluster mode), opened later: it outlives the listeners.
    std::unique_ptr<cluster::RedisPool> token_redis;
    std::atomic<const cluster::RedisPool *> redis_for_metrics{nullptr};
    router.add_metrics_source([&redis_for_metrics](obs::Registry & m) {
        if (const auto * r = redis_for_metrics.load()) obs::pool_metrics(m, "armada_redis_pool", r->stats());
    });
    api::HttpServer http(opt.http, [&router](api::HttpRequest && r, std::shared_ptr<api::Responder> out) {
        router.dispatch(std::move(r), std::move(out));
    });
    if (auto err = http.listen(); !err.empty()) {
        return common::fail(err);
    }
    // Prometheus scrapes a listener of its own, with no key: the main port's /metrics needs an
    // admin key once keys are set.
    std::unique_ptr<api::HttpServer> metrics_http;
    if (opt.metrics_port >= 0) {
        api::HttpConfig mc;
        mc.host = opt.metrics_host;
        mc.port = uint16_t(opt.metrics_port);
        mc.threads = 1;
        mc.max_body = 4096;
        mc.max_connections = 64;
        metrics_http = std::make_unique<api::HttpServer>(
            mc, [&router](api::HttpRequest && r, std::shared_ptr<api::Responder> out) {
                router.dispatch_metrics(std::move(r), std::move(out));
            });
        if (auto err = metrics_http->listen(); !err.empty()) {
            return common::fail(fmt::format("metrics listener: {}", err));
        }
        metrics_http->run();
        obs::announce(fmt::format("armada: metrics on http://{}:{}/metrics", opt.metrics_host, metrics_http->port()));
    }
    http.run();
    obs::announce(fmt::format("armada: listening on {}://{}:{} (loading model)", http.tls() ? "https" : "http",
                              opt.http.host, http.port()));
    auto stop_listeners = [&] {
        http.stop();
        if (metrics_http) metrics_http->stop();
    };

    std::string err;
    int last_pct = -1;
    auto progress = [&](float p) {
        const int pct = int(p * 100);
        if (pct / 10 != last_pct / 10) {
            if (obs::json_logs()) {
                obs::announce(fmt::format("armada: loading {}: {}%", opt.model, pct));  // one JSON line each
            } else {
                fprintf(stderr, "\rloading %s: %3d%%", opt.model.c_str(), pct);
                if (pct >= 100) fputc('\n', stderr);
            }
            last_pct = pct;
        }
    };
    // --numa-weights copy: the weights are read into private memory once per memory node, each
    // copy while the loading thread prefers that node; engines use their node's copy. The first
    // engine's copy also serves tokenising and templates.
    const bool copies = opt.numa_weights == "copy";
    engine::ModelLoadOptions load_opt;
    load_opt.mmap = !copies;
    load_opt.memory_node = copies ? configs[0].memory_node : -1;
    auto model = engine::Model::load(opt.model, progress, err, load_opt);
    if (!model) {
        fprintf(stderr, "\nerror: %s\n", err.c_str());
        stop_listeners();
        return 1;
    }
    std::map<int, std::shared_ptr<engine::Model>> weights{{load_opt.memory_node, model}};
    for (const auto & c : configs) {
        if (!copies || weights.count(c.memory_node)) continue;
        load_opt.memory_node = c.memory_node;
        last_pct = -1;
        auto m = engine::Model::load(opt.model, progress, err, load_opt);
        if (!m) {
            fprintf(stderr, "\nerror: %s\n", err.c_str());
            stop_listeners();
            return 1;
        }
        weights[c.memory_node] = std::move(m);
    }
    if (copies) {
        std::string nodes;
        for (const auto & [node, m] : weights)
            nodes += (nodes.empty() ? "" : ",") + (node >= 0 ? std::to_string(node) : std::string("any"));
        spdlog::info("weights: {} private {} (node {}), {} each", weights.size(),
                     weights.size() == 1 ? "copy" : "copies", nodes, engine::format_size(model->size_bytes()));
    }
    if (n_engines > 1 && ecfg.kv_budget == 0) {
        // Each engine would take the whole machine's budget for itself: share it out instead.
        const uint64_t mem = engine::memory_limit();
        const uint64_t used = model->size_bytes() * weights.size() + ecfg.kv_reserve;
        for (auto & c : configs)
            c.kv_budget = std::max<uint64_t>(mem > used ? (mem - used) / uint64_t(n_engines) : 0, 1);
    }
    std::vector<std::unique_ptr<engine::Engine>> engines;
    for (auto & c : configs) {
        auto w = weights.count(c.memory_node) ? weights.at(c.memory_node) : model;
        auto e = std::make_unique<engine::Engine>(w, c, &metrics);
        e->set_usage_hook([&limiter](const std::string & account, int64_t tokens) { limiter.charge(account, tokens); });
        if (auto msg = e->start(); !msg.empty()) {
            fprintf(stderr, "error: %s%s\n", n_engines > 1 ? ("engine " + std::to_string(c.index) + ": ").c_str() : "",
                    msg.c_str());
            for (auto & started : engines)
                started->stop();
            stop_listeners();
            return 1;
        }
        engines.push_back(std::move(e));
    }
    engine::EngineSet eng(std::move(engines));
    api::OpenAIService svc(model, eng, metrics, http.executor());
    engine::ChatFormat format(model);
    agent::EnginePort port(eng);
    agent::SystemClock clock;
    // Calls to servers a client named run on workers of their own, never on the I/O threads,
    // with a limit per tenant.
    tools::ClientCalls client_calls(opt.mcp_workers, opt.mcp_per_tenant);
    tools::TenantGate tool_gate(opt.tool_per_tenant);
    tools::McpClients mcp_clients(guard, tool_tls.get());
    tools::HttpToolTransport http_tools(http.executor(), guard, tool_tls);
    tools::RoutingTransport transport(http_tools, mcp_clients, client_calls, tool_gate);
    agent::SessionOptions sopt;
    sopt.ttl_ms = *ttl_ms;
    sopt.model = model->id();
    sopt.test_step_errors = opt.test_step_errors;
    sopt.hold_tools = opt.kv_hold_max_ms > 0 && !opt.no_park;
    sopt.kv_hold.max_hold_ms = opt.kv_hold_max_ms;
    sopt.kv_hold.default_ms = ecfg.park_grace_ms;
    // GPU pools: heavy agent steps run there (the cluster file's pools, or --pools on one node).
    std::unique_ptr<routing::PoolSet> pool_set;
    std::unique_ptr<routing::PoolStepRunner> pool_steps;
    // The pools and rules from --pools or the cluster file; nullopt with `perr` when it cannot be
    // read, nullopt alone when there are none.
    auto read_routing = [&](std::string & perr) -> std::optional<routing::RoutingConfig> {
        std::optional<routing::RoutingConfig> routing;
        if (!opt.pools_file.empty()) {
            routing = routing::load_routing_file(opt.pools_file, opt.model, perr);
        } else if (!opt.cluster_file.empty()) {
            auto c = cluster::load_cluster_config(opt.cluster_file, perr);
            if (c && !c->routing.pools.empty()) routing = c->routing;
        }
        if (routing) {
            // Every node of a cluster checks every upstream: at the gateways' pace, 4,096 nodes
            // would send a GPU server 2,000 health checks a second. Nodes check an upstream that
            // is up every 30 s at most often (the breaker notices one that fails meanwhile); one
            // that is down or whose breaker is open is still probed at health_ms.
            for (auto & p : routing->pools)
                p.up_health_ms = std::max(p.health_ms, 30000);
        }
        return routing;
    };
    {
        if (!opt.pools_file.empty() && ccfg) {
            fprintf(stderr, "error: --pools is for a single node; in a cluster, pools are in the cluster file\n");
            eng.stop();
            stop_listeners();
            return 2;
        }
        std::string perr;
        auto routing = read_routing(perr);
        if (!perr.empty() || (routing && !(pool_set = routing::PoolSet::open(routing->pools, perr)))) {
            fprintf(stderr, "error: pools: %s\n", perr.c_str());
            eng.stop();
            stop_listeners();
            return 2;
        }
        if (pool_set) {
            pool_set->set_metrics_prefix("armada_node_pool_");
            router.add_metrics_text([p = pool_set.get()] { return p->render_metrics(); });
            pool_set->start();
            // Sessions resumed at start would otherwise find every upstream still warming and
            // run their heavy steps here.
            if (!pool_set->wait_warm(10000)) spdlog::warn("GPU pools: some upstreams are not checked after 10 s");
            pool_steps = std::make_unique<routing::PoolStepRunner>(
                *routing, *pool_set,
                [&model](const std::string & text) { return int32_t(model->tokenize(text, false, true).size()); });
            sopt.pool = pool_steps.get();
            spdlog::info("GPU pools: {} ({} routing rules); heavy agent steps run there", pool_set->names().size(),
                         routing->routes.size());
        }
    }
    auto node_events = std::make_shared<NodeEvents>(node_name);
    auto lease_clock = std::make_shared<std::atomic<int64_t>>(0);
    std::unique_ptr<cluster::TokenCharger> token_charger;
    if (ccfg) {
        sopt.node = node_name;
        sopt.cell = opt.cell;
        // Tool calls go out only while the node's lease is current (set once it has joined).
        sopt.lease_current = [lease_clock] { return cluster::lease_current(*lease_clock); };
        // A session another node holds is taken over only once etcd says that node's lease is gone.
        sopt.holder_live = [etcd = std::make_shared<cluster::EtcdClient>(cluster::make_etcd(*ccfg, 2000)), cfg = *ccfg](
                               const std::string & cell, const std::string & node) {
            std::string why;
            if (!cluster::member_url(*etcd, cluster::node_key(cfg, cell, node), node, why).empty()) return 1;
            return why.rfind("etcd: ", 0) == 0 ? -1 : 0;
        };
        sopt.on_ended = [node_events](const std::string & id, const std::string & state) {
            node_events->ended(id, state);
        };
        if (!ccfg->redis.empty()) {
            // Sessions' model tokens count against their tenants' tokens per minute, as the
            // gateways see them. Redis is optional here: without it, they are not counted.
            std::string rerr;
            // One thread uses it (the charger, every 250 ms): the configured size, at most 2.
            token_redis =
                cluster::RedisPool::open(ccfg->redis, std::min(2, ccfg->redis_pool), 500, rerr, ccfg->redis_auth);
            if (token_redis) {
                redis_for_metrics = token_redis.get();
                token_charger = std::make_unique<cluster::TokenCharger>(*token_redis);
                sopt.on_tokens = [c = token_charger.get()](const std::string & tenant, int64_t n) {
                    c->add(tenant, n);
                };
            } else {
                spdlog::warn("cluster: Redis: {} (session tokens are not charged to tenant quotas)", rerr);
            }
        }
    }
    agent::SessionManager sessions(format, port, *st, transport, http.executor(), metrics, clock, sopt);
    for (auto & a : agents) {
        if (auto e = tools::import_mcp_tools(a.mcp_servers, a.tools, guard, tool_tls.get()); !e.empty()) {
            fprintf(stderr, "error: agent '%s': %s\n", a.id.c_str(), e.c_str());
            router.set_service(nullptr, nullptr, nullptr);
            eng.stop();
            stop_listeners();
            return 2;
        }
        sessions.put_operator_agent(a);
    }
    const size_t declared = sessions.load_declared_agents([&](agent::AgentSpec & a) {
        return tools::import_mcp_tools(a.mcp_servers, a.tools, guard, tool_tls.get(), opt.mcp_discover_ms);
    });
    if (declared > 0)
        obs::announce(fmt::format("armada: {} agents declared through the API loaded from {}", declared, opt.data_dir));
    const size_t resumed = sessions.resume_all();
    if (resumed > 0) obs::announce(fmt::format("armada: resumed {} sessions from {}", resumed, opt.data_dir));
    api::SessionsApi sessions_api(sessions, [&](agent::AgentSpec a, const std::string & tenant,
                                                std::function<void(std::string, agent::AgentSpec)> done) {
        auto spec = std::make_shared<agent::AgentSpec>(std::move(a));
        return client_calls.try_run(tenant, [&, spec, done] {
            auto e =
                tools::import_mcp_tools(spec->mcp_servers, spec->tools, guard, tool_tls.get(), opt.mcp_discover_ms);
            done(e, std::move(*spec));
        });
    });
    api::ResponsesService responses(model, eng, *st, http.executor(), mcp_clients, client_calls, opt.mcp_discover_ms);
    if (pool_steps) responses.set_pool(pool_steps.get());

    // Probes. Live: the engines' loops turn (a stuck decode for two minutes is not alive).
    // Ready: loaded and warm (set_service below), not draining, and a write reaches the store.
    api::StoreReadiness store_ready(*st, http.executor());
    router.set_probes(
        {[&eng] { return eng.stalled(120000); },
         [&store_ready](std::function<void(std::string)> answer) { store_ready.check(std::move(answer)); }});
    // POST /admin/drain (an operator, `armada cell drain`, a Kubernetes preStop hook): the same
    // drain as SIGTERM, started by sending it; asked twice, it still sends one (a second signal
    // would stop at once).
    router.set_drain_request([asked = std::make_shared<std::atomic<bool>>(false)] {
        if (!asked->exchange(true)) ::kill(::getpid(), SIGTERM);
    });
    // A session moving to another node takes its KV journal along: GET /admin/kv/{session}.
    int kv_cut = 0;
    if (const char * v = std::getenv("ARMADA_KV_SEND_CUT")) kv_cut = std::max(0, std::atoi(v));
    KvSender kv_sender(eng, sessions, kv_cut);
    if (ccfg)
        router.set_kv_sender([&kv_sender](const std::string & id, std::shared_ptr<api::Responder> out) {
            kv_sender.send(id, std::move(out));
        });
    router.set_service(&svc, &eng, &sessions_api, &responses);
    obs::announce(fmt::format("armada: ready, model {}, {} sequences x {} tokens{}", model->id(), opt.engine.n_seq_max,
                              eng.n_ctx_seq(), n_engines > 1 ? " on " + std::to_string(n_engines) + " engines" : ""));

    // Cluster mode: join the cell (a lease and load reports in etcd) and take its commands.
    std::unique_ptr<ClusterNode> cluster_node;
    if (ccfg) {
        const std::string url = !opt.advertise.empty()
                                    ? opt.advertise
                                    : std::string(http.tls() ? "https" : "http") + "://" +
                                          (opt.http.host == "0.0.0.0" ? std::string("127.0.0.1") : opt.http.host) +
                                          ":" + std::to_string(http.port());
        const std::string fp = eng.size() > 0 ? eng.at(0).fingerprint() : std::string();
        const int64_t started_wall_ms = common::wall_ms();
        auto report = [&, url, fp, started_wall_ms] {
            cluster::NodeLoad l;
            l.by_state = sessions.live_by_state();
            int live = 0;
            for (const auto & [st, n] : l.by_state)
                live += n;
            l.sessions = live;
            l.engines = int(eng.size());
            for (size_t i = 0; i < eng.size(); ++i) {
                const auto & c = eng.at(i).config();
                const int pinned = int(c.cpus.size());
                l.cores += c.n_threads > 0 ? (pinned > 0 ? std::min(c.n_threads, pinned) : c.n_threads)
                                           : (pinned > 0 ? pinned : int(std::thread::hardware_concurrency()));
            }
            l.step_ms = sessions.recent_step_ms();
            l.ctx = eng.size() > 0 ? eng.n_ctx_seq() : 0;
            l.free_seqs = std::max(0, opt.cluster_sessions - live);
            l.kv_headroom = int64_t(eng.kv_headroom());
            l.kv_budget = int64_t(eng.kv_budget());
            // What each tenant holds in memory (slots and RAM; KV parked on disk is not counted).
            for (const auto & [id, tenant] : sessions.live_owners()) {
                if (auto u = eng.kv_usage(id); u && u->where != "disk") l.kv_by_tenant[tenant] += int64_t(u->bytes);
            }
            l.version = opt.version_label.empty() ? std::string(ARMADA_VERSION) : opt.version_label;
            // What the rollouts' gates compare (the heartbeat counts are the membership's own).
            const auto sig = sessions.signals();
            l.signals.started_ms = started_wall_ms;
            l.signals.steps = sig.steps;
            l.signals.step_s = sig.step_s;
            l.signals.completed = sig.completed;
            l.signals.failed = sig.failed;
            for (const auto & [code, n] : {std::pair<const char *, int64_t>{"model", sig.model_errors},
                                           {"tool", sig.tool_errors},
                                           {"store", sig.store_errors},
                                           {"http_5xx", router.server_errors()}})
                if (n > 0) l.signals.errors[code] = n;
            l.fingerprint = fp;
            l.draining = router.draining();
            l.url = url;
            // The figures the cell's brain and the dashboard see for this node, in its /metrics too.
            metrics.gauge("armada_node_free_sequences", "Sessions this node can still take, as it reports to its cell")
                .set(double(l.free_seqs));
            metrics
                .gauge("armada_node_step_latency_seconds",
                       "Recent model step time (a moving average), as the node reports it to its cell")
                .set(l.step_ms / 1000.0);
            if (l.kv_budget > 0)
                metrics
                    .gauge("armada_node_kv_watermark_ratio",
                           "Share of the KV budget in use (prompt-cache entries, which yield, not counted), as the "
                           "node reports it to its cell")
                    .set(double(l.kv_budget - l.kv_headroom) / double(l.kv_budget));
            return l;
        };
        auto fetch = [&eng, &peer_keys, tls = node_tls ? node_tls : tool_tls, disk = ecfg.kv_disk_limit](
                         const std::string & id, const std::string & from, const std::string & from_url,
                         uint64_t stated) {
            return fetch_kv(eng, id, from, from_url, peer_keys, tls.get(), disk, stated);
        };
        cluster_node =
            std::make_unique<ClusterNode>(*ccfg, opt.cell, node_name, sessions, report, node_events, std::move(fetch));
        // Past the high watermark (--kv-rebalance-at of the KV budget in use), sessions are offered
        // to nodes with room: "compact or migrate, never let the OOM killer choose".
        if (opt.kv_rebalance_at > 0)
            cluster_node->set_kv_high([&eng, at = opt.kv_rebalance_at] {
                const double budget = double(eng.kv_budget());
                return budget > 0 && 1.0 - double(eng.kv_headroom()) / budget >= at;
            });
        cluster_node->share_lease_clock(lease_clock);
        if (auto e = cluster_node->start(); !e.empty()) {
            fprintf(stderr, "error: cluster: %s\n", e.c_str());
            fflush(nullptr);
            std::_Exit(1);
        }
        obs::announce(fmt::format("armada: node {} joined cell {} at {}", node_name, opt.cell, url));
    }

    // The main thread waits for a stop signal, and meanwhile deletes what outlived the TTL
    // (every minute, or more often for a short TTL).
    sessions.expire_old();
    const int64_t sweep_ms = *ttl_ms > 0 ? std::clamp<int64_t>(*ttl_ms / 4, 1000, 60000) : 60000;
    int sig = 0;
    for (;;) {
        timespec wait{time_t(sweep_ms / 1000), long(sweep_ms % 1000) * 1000000L};
        sig = sigtimedwait(&wait_set, nullptr, &wait);
        if (sig == SIGHUP) {
            std::string perr;
            auto routing = read_routing(perr);
            if (!pool_steps) {
                spdlog::warn("SIGHUP: this node started without GPU pools; they need a restart");
            } else if (!routing) {
                spdlog::error("SIGHUP: pools: {}; keeping them as they were",
                              perr.empty() ? "the file names none now" : perr);
            } else if (auto e = pool_steps->reload(*routing); !e.empty()) {
                spdlog::error("SIGHUP: pools: {}; keeping them as they were", e);
            } else {
                spdlog::info("SIGHUP: pools reloaded: {} pools, {} routes", routing->pools.size(),
                             routing->routes.size());
            }
            continue;
        }
        if (sig > 0) break;
        sessions.expire_old();
    }
    // Drain (SIGTERM, a Kubernetes preStop): not ready at once, new work refused with 503,
    // running steps and completions finish, sessions between steps are already checkpointed.
    spdlog::info("signal {}: draining (at most {} s; a second signal stops at once)", sig, opt.drain_timeout_s);
    router.set_draining();
    if (cluster_node) {  // the brain stops placing here now, not at the next load report
        node_events->draining();
        cluster_node->set_draining();  // and moves the sessions away, with their KV
    }
    http.set_closing();
    sessions.drain();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(opt.drain_timeout_s * 1000));
    bool drained = false;
    // In a cell, the node is empty once the store gives it no open session, and no other node is
    // still fetching KV from it (a move's fetch starts just after its assignment is written, so
    // that has to hold for a while).
    auto empty_since = std::chrono::steady_clock::time_point::max();
    const int64_t drain_started_ms = common::steady_ms();
    auto next_look = std::chrono::steady_clock::now();
    for (;;) {
        const auto now = std::chrono::steady_clock::now();
        if (cluster_node && now >= next_look) {
            next_look = now + std::chrono::milliseconds(250);
            auto open = sessions.open_here();
            // With no other node taking work in the cell, its sessions have nowhere to go: they
            // stay checkpointed for the next node that comes, as on a single node.
            if (open && *open > 0 && cluster_node->peers_taking_work() == size_t(0)) open = 0;
            // KV still owed: a session offered and moved away whose journal is here and has not
            // been asked for yet (its new node's fetch waits for a fetcher thread). Owed KV holds
            // the exit for at most 20 s with no send ending.
            size_t owed = 0;
            if (open && *open == 0) {
                for (const auto & id : cluster_node->offered())
                    owed += !kv_sender.served(id) && eng.kv_usage(id).has_value();
                const int64_t idle_ms = common::steady_ms() - std::max(kv_sender.last_served_ms(), drain_started_ms);
                if (owed > 0 && idle_ms > 20000) {
                    spdlog::warn("drain: {} sessions moved away without asking for their KV in 20 s; not waiting",
                                 owed);
                    owed = 0;
                }
            }
            if (open && *open == 0 && owed == 0 && kv_sender.active() == 0 && cluster_node->arriving() == 0) {
                if (empty_since == std::chrono::steady_clock::time_point::max()) empty_since = now;
            } else {
                empty_since = std::chrono::steady_clock::time_point::max();
            }
        }
        const bool empty = !cluster_node || (empty_since != std::chrono::steady_clock::time_point::max() &&
                                             now - empty_since >= std::chrono::seconds(2));
        if (empty && sessions.quiet() && eng.idle() && http.exchanges() == 0 && !client_calls.busy()) {
            drained = true;
            break;
        }
        if (std::chrono::steady_clock::now() >= deadline) break;
        timespec tick{0, 20 * 1000 * 1000};
        if (sigtimedwait(&stop_set, nullptr, &tick) > 0) break;
    }
    if (!drained) {
        // What is still running resumes from its last checkpoint at the next start, as after a
        // crash: nothing acknowledged is lost.
        spdlog::warn("stopping before the drain finished ({}); unfinished work resumes at the next start",
                     std::chrono::steady_clock::now() >= deadline ? "deadline" : "second signal");
        // In a cell, they resume on other nodes at once: the lease goes now, not at its TTL.
        if (cluster_node) cluster_node->leave_now();
        fflush(nullptr);
        std::_Exit(1);
    }
    spdlog::info("drained; stopping");
    router.set_kv_sender({});  // nothing more is sent; the sender goes before the HTTP server
    if (cluster_node) cluster_node->stop();
    if (pool_steps) pool_steps->stop();
    if (pool_set) pool_set->stop();
    router.set_service(nullptr, nullptr, nullptr);
    // Calls to client-named servers finish before what they report to is destroyed.
    client_calls.join();
    eng.stop();
    stop_listeners();
    return 0;
}

}  // namespace armada::cli

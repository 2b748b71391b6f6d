// What a gateway shows on /metrics: its own counts (counters.h), its view's, its dependencies'
// pools, and the GPU pools'.
#include "cluster/quota.h"
#include "cluster/redis.h"
#include "gateway/cluster_view.h"
#include "gateway/gateway.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "routing/pool_set.h"
#include "store/cluster_store.h"

namespace armada::gateway {

std::string Gateway::render_metrics() {
    obs::Registry m;
    m.gauge("armada_gateway_nodes", "Live nodes the gateway sees in etcd").set(double(view_->node_count()));
    m.sync_counter("armada_gateway_requests_total", "Requests the gateway took", counts_.requests.load());
    for (size_t c = 1; c < 6; ++c)
        m.sync_counter("armada_gateway_responses_total", "Answers the gateway gave, by status class",
                       counts_.answers(c), {{"code", std::to_string(c) + "xx"}});
    m.sync_counter("armada_gateway_streams_refused_total",
                   "Session event streams refused (429): the tenant had its cap of them open",
                   counts_.refused_streams.load());
    m.sync_counter("armada_gateway_workers_refused_total",
                   "Requests refused (503): every worker thread was busy and the gateway had its cap of them",
                   counts_.refused_workers.load());
    m.gauge("armada_gateway_worker_threads", "Worker threads alive (busy or idle)").set(double(workers_.threads()));
    m.sync_counter("armada_gateway_sessions_refused_full_total",
                   "New sessions refused (503 cluster_full) because every cell was at its water level",
                   counts_.refused_full.load());
    {
        // A registry made per scrape: the tracer's running totals are copied, not attached.
        const auto t = obs::tracer();
        m.sync_counter("armada_trace_spans_exported_total", "Spans the OTLP collector accepted", t->exported());
        m.sync_counter("armada_trace_spans_dropped_total",
                       "Spans dropped: the queue was full or the collector refused or was away", t->dropped());
    }
    for (const auto & [quota, n] : counts_.quota_refusals())
        m.sync_counter("armada_gateway_quota_refused_total", "Requests refused (429) by a quota", n,
                       {{"quota", quota}});
    m.gauge("armada_gateway_quota_local",
            "1 while Redis cannot be reached and this gateway enforces its share of each quota alone")
        .set(quotas_->local() ? 1 : 0);
    m.sync_counter("armada_gateway_quota_local_decisions_total",
                   "Quota decisions this gateway made alone (Redis unreachable)", quotas_->local_decisions());
    m.gauge("armada_gateway_live_gateways", "Gateways live in etcd (each one's share of a quota without Redis)")
        .set(view_->live_gateways());
    m.sync_counter("armada_gateway_route_cache_hits_total", "Session reads routed from the Redis route cache",
                   counts_.route_hits.load());
    if (auto p = store_->pool_stats()) obs::pool_metrics(m, "armada_store_pool", *p);
    if (redis_) obs::pool_metrics(m, "armada_redis_pool", redis_->stats());
    {
        for (const auto & [k, n] : counts_.routes())
            m.sync_counter("armada_gateway_routed_total",
                           "Chat and text completions by where they went (cpu or a pool) and the rule that chose it", n,
                           {{"route", k.first}, {"rule", k.second}});
        for (const auto & [k, n] : counts_.fallbacks())
            m.sync_counter("armada_gateway_route_fallbacks_total",
                           "Requests a rule sent to a pool that went to the CPU nodes instead, by why", n,
                           {{"pool", k.first}, {"reason", k.second}});
    }
    return m.render() + (pools_ ? pools_->render_metrics() : std::string());
}

}  // namespace armada::gateway

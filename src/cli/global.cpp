#include "cli/global.h"

#include "cli/brain_http.h"
#include "common/cli_exit.h"
#include "common/stop_signals.h"

#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/kube_restarter.h"
#include "cluster/queue.h"
#include "cluster/restarter.h"
#include "cluster/runtime/bus.h"
#include "cluster/runtime/clock.h"
#include "cluster/runtime/elected.h"
#include "cluster/runtime/global_runner.h"
#include "obs/log.h"
#include "store/cluster_store.h"

#include <spdlog/spdlog.h>

#include <unistd.h>
#include <cstdio>

namespace armada::cli {

using common::fail;

namespace {

using namespace cluster;

//! One global brain process: its lease and campaign; while it leads, the global runner's loop.
class GlobalProcess {
  public:
    GlobalProcess(ClusterConfig cfg, GlobalOptions o, sigset_t stop_set)
        : cfg_(std::move(cfg)),
          o_(std::move(o)),
          etcd_(make_etcd(cfg_)),
          kv_(etcd_),
          elected_(kv_, cfg_.lease_ttl_s, "global", signal_waiter(stop_set)) {
        if (o_.restarter == "cluster-up") restarter_ = std::make_unique<EtcdRestarter>(etcd_, cfg_);
        if (o_.restarter == "kubernetes") {
            KubeConfig kc;
            kc.image = o_.kube_image;
            if (auto e = kube_config_in_pod(kc); !e.empty()) {
                kube_error_ = e;
            } else {
                ledger_ = std::make_unique<EtcdLedger>(etcd_, cfg_);
                restarter_ =
                    std::make_unique<KubeRestarter>(std::move(kc), *ledger_, [] { return real_clock().wall_ms(); });
            }
        }
    }

    int run() {
        store::PostgresConfig pc;
        pc.urls = cfg_.postgres;
        pc.read_connections = cfg_.pg_pool;
        brain_store_limits(cfg_.lease_ttl_s, pc.statement_timeout_ms, pc.client_grace_ms);
        std::string err;
        auto store = store::open_cluster_store(pc, err);
        if (!store) return fail("PostgreSQL: " + err);
        auto js = JetStream::connect(cfg_.nats, err, cfg_.nats_auth);
        if (!js) return fail("NATS at " + cfg_.nats + ": " + err);
        JetStreamBus bus(*js);
        std::shared_ptr<void> metrics_http;  // the metrics listener, while it runs
        if (o_.metrics_port >= 0) {
            metrics_http = serve_brain_metrics(elected_.metrics(), o_.metrics_host, o_.metrics_port, err);
            if (!metrics_http) return fail("metrics listener: " + err);
        }
        GlobalRunnerConfig rc;
        rc.prefix = cfg_.prefix;
        for (const auto & c : cfg_.cells)
            rc.cells.push_back({c.name, c.domain, c.water});
        rc.tick_ms = o_.tick_ms;
        rc.shares_ms = o_.shares_ms;
        rc.lease_ttl_s = cfg_.lease_ttl_s;
        GlobalRunner runner(rc, kv_, bus, *store, real_clock(), elected_.metrics(), restarter_.get(), kube_error_);
        obs::announce(fmt::format("armada: global brain {} started", o_.name));
        const std::string election = global_election(cfg_);
        elected_.run(election, o_.name, [&](const EtcdLeader & me) {
            obs::announce(fmt::format("armada: global brain {} leads", o_.name));
            ElectedTerm term(elected_, me, election);
            runner.lead(term);
        });
        spdlog::info("global: brain {} stopped", o_.name);
        return 0;
    }

  private:
    ClusterConfig cfg_;
    GlobalOptions o_;
    EtcdClient etcd_;
    EtcdKvStore kv_;
    Elected elected_;
    std::unique_ptr<RestartLedger> ledger_;  // before the restarter that uses it
    std::unique_ptr<NodeRestarter> restarter_;
    std::string kube_error_;  // none: rollouts halt at once
};

}  // namespace

int global_command(const GlobalOptions & opt) {
    const sigset_t stop_set = common::block_stop_signals();
    spdlog::set_level(spdlog::level::from_str(opt.log_level));
    std::string err;
    auto cfg = load_cluster_config_for_service(opt.cluster_file, err);
    if (!cfg) {
        return common::fail(err, 2);
    }
    GlobalOptions o = opt;
    if (o.name.empty()) {
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        o.name = std::string(host) + "-" + std::to_string(getpid());
    }
    return GlobalProcess(*cfg, o, stop_set).run();
}

}  // namespace armada::cli

#include "cli/cell.h"

#include "cli/brain_http.h"
#include "common/cli_exit.h"
#include "common/stop_signals.h"

#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/queue.h"
#include "cluster/runtime/bus.h"
#include "cluster/runtime/cell_runner.h"
#include "cluster/runtime/elected.h"
#include "obs/log.h"
#include "store/cluster_store.h"

#include <spdlog/spdlog.h>

#include <unistd.h>
#include <csignal>
#include <cstdio>

namespace armada::cli {

using common::fail;

namespace {

using namespace cluster;

//! One brain process: its lease and campaign; while it leads, the cell runner's loop.
class CellProcess {
  public:
    CellProcess(ClusterConfig cfg, CellOptions o, sigset_t stop_set)
        : cfg_(std::move(cfg)),
          o_(std::move(o)),
          etcd_(make_etcd(cfg_)),
          kv_(etcd_),
          elected_(kv_, cfg_.lease_ttl_s, "cell " + o_.cell, signal_waiter(stop_set)) {}

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
        // Every brain of the cell shares one durable consumer: whoever leads fetches from it.
        auto place = js->consumer("ARMADA_PLACE", "cell-" + o_.cell, place_subject(o_.cell), 30000, 10, err);
        if (!place) return fail("NATS consumer: " + err);
        auto events =
            js->consumer("ARMADA_EVENT", "cell-" + o_.cell + "-events", event_subject(o_.cell), 30000, 10, err);
        if (!events) return fail("NATS consumer: " + err);
        ConsumerInbox places(std::move(place)), event_inbox(std::move(events));
        JetStreamBus bus(*js);
        std::shared_ptr<void> metrics_http;  // the metrics listener, while it runs
        if (o_.metrics_port >= 0) {
            metrics_http = serve_brain_metrics(elected_.metrics(), o_.metrics_host, o_.metrics_port, err);
            if (!metrics_http) return fail("metrics listener: " + err);
        }
        CellRunnerConfig rc;
        rc.cell = o_.cell;
        rc.prefix = cfg_.prefix;
        rc.reconcile_ms = o_.reconcile_ms;
        CellRunner runner(rc, kv_, bus, places, event_inbox, *store, real_clock(), elected_.metrics());
        obs::announce(fmt::format("armada: cell brain {} of cell {} started", o_.name, o_.cell));
        const std::string election = brain_election(cfg_, o_.cell);
        elected_.run(election, o_.name, [&](const EtcdLeader & me) {
            obs::announce(fmt::format("armada: cell brain {} leads cell {}", o_.name, o_.cell));
            ElectedTerm term(elected_, me, election);
            runner.lead(term);
        });
        spdlog::info("cell {}: brain {} stopped", o_.cell, o_.name);
        return 0;
    }

  private:
    ClusterConfig cfg_;
    CellOptions o_;
    EtcdClient etcd_;
    EtcdKvStore kv_;
    Elected elected_;
};

}  // namespace

int cell_command(const CellOptions & opt) {
    const sigset_t stop_set = common::block_stop_signals();
    spdlog::set_level(spdlog::level::from_str(opt.log_level));
    std::string err;
    auto cfg = load_cluster_config_for_service(opt.cluster_file, err);
    if (!cfg) {
        return common::fail(err, 2);
    }
    CellOptions o = opt;
    if (!valid_cell_or_node_name(o.cell)) {
        return common::fail(fmt::format("--cell '{}' must be 1..63 of A-Z a-z 0-9 . _ -", o.cell), 2);
    }
    if (o.name.empty()) {
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        o.name = std::string(host) + "-" + std::to_string(getpid());
    }
    return CellProcess(*cfg, o, stop_set).run();
}

}  // namespace armada::cli

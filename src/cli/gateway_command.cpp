// `armada gateway`: flags are parsed in main.cpp; this runs the gateway (gateway/gateway.h) until
// SIGINT or SIGTERM, and reloads its pools on SIGHUP.
#include "cli/gateway_command.h"
#include "api/http_server.h"
#include "cluster/cluster_config.h"
#include "common/cli_exit.h"
#include "common/stop_signals.h"
#include "obs/log.h"

#include <spdlog/spdlog.h>

#include <pthread.h>
#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace armada::cli {

using gateway::Gateway;
using gateway::GatewayOptions;

int gateway_command(const GatewayOptions & opt) {
    sigset_t stop_set = common::block_stop_signals();
    sigaddset(&stop_set, SIGHUP);  // reloads the pools
    pthread_sigmask(SIG_BLOCK, &stop_set, nullptr);
    spdlog::set_level(spdlog::level::from_str(opt.log_level));
    std::string err;
    auto cfg = cluster::load_cluster_config_for_service(opt.cluster_file, err);
    if (!cfg) {
        return common::fail(err, 2);
    }
    if (!opt.cell.empty() && !cluster::valid_cell_or_node_name(opt.cell)) {
        return common::fail(fmt::format("--cell '{}' must be 1..63 of A-Z a-z 0-9 . _ -", opt.cell), 2);
    }
    api::ApiKeys keys;
    if (auto e = keys.load_flags(opt.api_key, opt.api_key_file); !e.empty()) {
        return common::fail(e, 2);
    }
    if (!opt.name.empty() && !cluster::valid_cell_or_node_name(opt.name)) {
        return common::fail(fmt::format("--name '{}' must be 1..63 of A-Z a-z 0-9 . _ -", opt.name), 2);
    }
    Gateway gw(*cfg, opt, std::move(keys));
    if (auto e = gw.start(); !e.empty()) {
        return common::fail(e);
    }
    api::HttpServer http(opt.http, [&gw](api::HttpRequest && r, std::shared_ptr<api::Responder> out) {
        gw.handle(std::move(r), std::move(out));
    });
    if (auto e = http.listen(); !e.empty()) {
        return common::fail(e);
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

}  // namespace armada::cli

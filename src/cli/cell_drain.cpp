#include "cli/cell_drain.h"

#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/membership.h"
#include "cluster/runtime/keys.h"
#include "common/cli_exit.h"
#include "net/tls.h"
#include "tools/http_sync.h"
#include "tools/ssrf.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <thread>

namespace armada::cli {

using common::fail;

namespace {

//! The live nodes in etcd: name → (cell, URL).
std::optional<std::map<std::string, std::pair<std::string, std::string>>> live_nodes(cluster::EtcdClient & etcd,
                                                                                     const cluster::ClusterConfig & cfg,
                                                                                     std::string & err) {
    std::vector<cluster::EtcdKv> kvs;
    int64_t rev = 0;
    if (err = etcd.list(cluster::cells_prefix(cfg), kvs, rev); !err.empty()) return std::nullopt;
    std::map<std::string, std::pair<std::string, std::string>> out;
    const cluster::ClusterKeys keys(cfg.prefix);
    for (const auto & kv : kvs) {
        const auto k = keys.parse(kv.key);
        if (k.kind != cluster::ClusterKeys::Parsed::Kind::Node) continue;
        if (auto l = cluster::decode_load(k.name, kv.value)) out[k.name] = {k.cell, l->url};
    }
    return out;
}

}  // namespace

int drain_command(const DrainOptions & o) {
    std::string err;
    auto cfg = cluster::load_cluster_config_for_service(o.cluster_file, err);
    if (!cfg) return fail(err);
    cluster::EtcdClient etcd = cluster::make_etcd(*cfg);
    auto nodes = live_nodes(etcd, *cfg, err);
    if (!nodes) return fail("cannot read the cluster's nodes from etcd: " + err);
    auto it = nodes->find(o.node);
    if (it == nodes->end()) {
        std::string names;
        for (const auto & [n, where] : *nodes)
            names += (names.empty() ? "" : ", ") + n;
        return fail("no live node named '" + o.node + "' in etcd" +
                    (names.empty() ? std::string("; none has joined") : "; the live nodes are " + names));
    }
    const auto & [cell, url] = it->second;
    if (url.empty()) return fail("node '" + o.node + "' has not said where its API answers (an older node?)");
    // The node's address comes from etcd, which the operator runs: any address is allowed.
    tools::SsrfGuard guard;
    for (const char * all : {"0.0.0.0/0", "::/0"}) {
        tools::Cidr c;
        if (tools::parse_cidr(all, c)) guard.allow(c);
    }
    tools::HttpOptions ho;
    ho.timeout_ms = 10000;
    ho.follow_redirects = false;
    std::shared_ptr<boost::asio::ssl::context> tls;
    if (url.rfind("https://", 0) == 0) {
        // Checked against the cluster's CA too, when the cluster file names one for its nodes.
        tls = cfg->nodes_auth.tls() ? cluster::service_tls(cfg->nodes_auth, "credentials.nodes", err)
                                    : armada::net::client_tls("", err);
        if (!tls) return fail("TLS: " + err);
        ho.tls = tls.get();
    }
    std::vector<std::pair<std::string, std::string>> headers;
    if (!o.api_key.empty()) headers.emplace_back("Authorization", "Bearer " + o.api_key);
    const auto r = tools::http_request("POST", url + "/admin/drain", headers, "", ho, guard);
    if (!r.error.empty()) return fail("node '" + o.node + "' at " + url + ": " + r.error);
    if (r.status == 401 || r.status == 403)
        return fail("node '" + o.node + "' refused the drain (HTTP " + std::to_string(r.status) +
                    "): give an admin key it knows with --api-key or ARMADA_API_KEY");
    if (r.status != 202)
        return fail("node '" + o.node + "' answered HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 300));
    const bool already = r.body.find("\"already\":true") != std::string::npos;
    printf(
        "node %s of cell %s %s: it takes nothing new, finishes its running steps and leaves; its cell's brain "
        "gives its sessions to other nodes\n",
        o.node.c_str(), cell.c_str(), already ? "was already draining" : "drains");
    fflush(stdout);
    if (!o.wait) return 0;
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + std::chrono::seconds(o.timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        auto now = live_nodes(etcd, *cfg, err);
        if (!now) continue;  // etcd away for a moment: ask again
        if (!now->count(o.node)) {
            printf("node %s left after %.1f s\n", o.node.c_str(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            return 0;
        }
    }
    return fail("node '" + o.node + "' is still in the cluster after " + std::to_string(o.timeout_s) +
                " s (its --drain-timeout may be longer)");
}

}  // namespace armada::cli

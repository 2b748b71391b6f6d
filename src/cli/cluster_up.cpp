#include "cli/cluster_up.h"

#include "common/cli_exit.h"
#include "common/stop_signals.h"

#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/hang_proxy.h"
#include "cluster/local_servers.h"
#include "cluster/restarter.h"
#include "cluster/runtime/clock.h"
#include "cluster/runtime/kv.h"
#include "cluster/runtime/supervisor.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace armada::cli {

namespace {

// A key of 32 random bytes from the kernel, as hex: the nodes' peer key for this cluster.
std::string random_key() {
    unsigned char b[32] = {};
    std::ifstream f("/dev/urandom", std::ios::binary);
    f.read(reinterpret_cast<char *>(b), sizeof(b));
    if (!f) {
        // Never run without one: the random device failing is no reason to serve KV to anyone.
        std::random_device rd;
        for (auto & x : b)
            x = static_cast<unsigned char>(rd());
    }
    static const char * hex = "0123456789abcdef";
    std::string s;
    for (unsigned char x : b) {
        s += hex[x >> 4];
        s += hex[x & 15];
    }
    return s;
}

using json = nlohmann::json;
namespace fs = std::filesystem;
using cluster::Child;

std::string self_exe() {
    std::error_code ec;
    auto p = fs::read_symlink("/proc/self/exe", ec);
    return ec ? std::string("armada") : p.string();
}

bool http_ok(int port) {
    // /health answers 200 once a process is ready; a bare TCP check is enough to wait for the
    // listener, then the caller polls readiness through the process's own log.
    return cluster::port_open(port);
}

}  // namespace

int cluster_up(const ClusterUpOptions & o) {
    const sigset_t stop_set = common::block_stop_signals();
    if (o.model.empty()) {
        return common::fail("no model given; use -m FILE", 2);
    }
    if (o.cells < 1 || o.cells > 16 || o.nodes < 1 || o.nodes > 64 || o.brains < 1 || o.brains > 5) {
        return common::fail("--cells 1..16, --nodes 1..64 and --brains 1..5", 2);
    }
    // GPU pools and routing rules (a part of a cluster file), checked before anything starts.
    std::string routing;
    if (!o.pools_file.empty()) {
        std::ifstream f(o.pools_file);
        if (!f) {
            return common::fail(fmt::format("cannot read --pools {}", o.pools_file), 2);
        }
        std::stringstream ss;
        ss << f.rdbuf();
        routing = ss.str();
        if (routing.find("tokenizer:") == std::string::npos) routing += "\ntokenizer: " + o.model + "\n";
        std::string err;
        if (!cluster::parse_cluster_config("etcd: [x:1]\npostgres: [postgres://x]\n" + routing, err)) {
            return common::fail(fmt::format("--pools {}: {}", o.pools_file, err), 2);
        }
    }
    std::error_code ec;
    fs::create_directories(o.data_dir + "/logs", ec);
    if (ec) {
        return common::fail(fmt::format("cannot create {}: {}", o.data_dir, ec.message()));
    }
    std::string dir = fs::absolute(o.data_dir).lexically_normal().string();
    if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const std::string logs = dir + "/logs/";
    // PostgreSQL runs as its own user when root starts it, and must reach its directory. The
    // default data directory of a checkout under /root is closed to it: its database then lives
    // under /var/lib/armada, and `<data-dir>/postgres` links there. A --data-dir given that way
    // stays an error, which says how to fix it.
    if (::geteuid() == 0 && !o.data_dir_given && !cluster::closed_ancestor(dir + "/postgres").empty()) {
        const std::string home = cluster::postgres_home_for(dir);
        const fs::path link = dir + "/postgres";
        if (!fs::is_symlink(link, ec)) {
            if (fs::exists(link, ec)) {
                fprintf(stderr,
                        "error: %s is a directory PostgreSQL's user cannot reach; move it aside, or give a "
                        "--data-dir it can reach\n",
                        link.c_str());
                return 1;
            }
            // A data directory made afresh: whatever an earlier one at this path left there goes.
            fs::remove_all(home, ec);
            fs::create_directories(home, ec);
            if (!ec) fs::create_directory_symlink(home, link, ec);
            if (ec) {
                return common::fail(fmt::format("cannot keep PostgreSQL's data in {}: {}", home, ec.message()));
            }
        }
        ::chmod("/var/lib/armada", 0755);
        ::chmod("/var/lib/armada/postgres", 0711);
        printf("armada: %s is closed to the postgres user: PostgreSQL's data is in %s\n", dir.c_str(), home.c_str());
    }

    // The servers, each with one job (CLUSTER.md).
    cluster::LocalPostgres pg;
    cluster::LocalEtcd etcd;
    cluster::LocalDaemon nats(cluster::LocalDaemon::Kind::Nats), redis(cluster::LocalDaemon::Kind::Redis);
    auto up = [&](const char * what, const std::string & e) {
        if (e.empty()) {
            printf("armada: %s started\n", what);
            fflush(stdout);
            return true;
        }
        fprintf(stderr, "error: %s: %s\n", what, e.c_str());
        return false;
    };
    // A session's shard is a hash of its id modulo the count: a data directory keeps the count
    // it was made with, or its sessions would be looked for in the wrong databases.
    {
        const std::string count_file = dir + "/postgres/shards";
        std::ifstream in(count_file);
        int had = 0;
        // (A directory from before the count was kept has the one database.)
        if (!(in >> had) && fs::exists(dir + "/postgres/data/PG_VERSION", ec)) had = 1;
        if (had > 0 && had != o.pg_shards) {
            fprintf(stderr,
                    "error: %s keeps its sessions in %d PostgreSQL database(s), placed by a hash of their id; "
                    "--pg-shards %d would look for them in the wrong ones. Use --pg-shards %d, or a new --data-dir\n",
                    dir.c_str(), had, o.pg_shards, had);
            return 2;
        }
    }
    std::vector<std::string> databases{"armada"};
    for (int i = 1; i < o.pg_shards; ++i)
        databases.push_back("armada_shard" + std::to_string(i));
    // --tls: a CA of this cluster's own and a certificate for this machine's loopback names, made
    // once with the openssl command; the keys are root's alone. The gateway and every server
    // (PostgreSQL, etcd, NATS, Redis) show that certificate, and every client checks it.
    cluster::ServerTls server_tls;
    if (o.tls) {
        std::string err;
        server_tls = cluster::make_local_tls(dir + "/tls", err);
        if (!server_tls.on()) {
            return common::fail(fmt::format("--tls: {}", err));
        }
        pg.use_tls(server_tls);
        etcd.use_tls(server_tls);
        nats.use_tls(server_tls);
        redis.use_tls(server_tls);
    }
    // Every server's secrets (passwords, the PostgreSQL passfile) live here, root's alone (0700
    // directory, 0600 files), and cluster.yaml only names them.
    const std::string secrets = dir + "/secrets";
    // (Through the link, if there is one: the server's user reaches the real path.)
    const std::string pg_dir =
        fs::is_symlink(dir + "/postgres", ec) ? fs::read_symlink(dir + "/postgres", ec).string() : dir + "/postgres";
    if (!up("postgresql", pg.start(pg_dir, 0, secrets))) return 1;
    for (const auto & db : databases) {
        if (!up(("postgresql database " + db).c_str(), pg.create_database(db))) return 1;
    }
    std::ofstream(dir + "/postgres/shards") << o.pg_shards << "\n";
    if (!up("etcd", etcd.start(dir + "/etcd")) ||
        !up("etcd authentication", etcd.enable_auth(secrets, "armada", cluster::ClusterConfig{}.prefix)) ||
        !up("nats", nats.start(dir + "/nats", 0, secrets)) || !up("redis", redis.start(dir + "/redis", 0, secrets)))
        return 1;
    // --fault-proxies: each server behind a proxy of this process, hung while its file exists.
    std::map<std::string, std::unique_ptr<cluster::HangProxy>> proxies;
    const std::string proxy_dir = dir + "/proxies/";
    if (o.fault_proxies) {
        fs::create_directories(proxy_dir, ec);
        for (const auto & [name, port] : {std::pair<std::string, int>{"postgres", pg.port()},
                                          {"etcd", etcd.port()},
                                          {"nats", nats.port()},
                                          {"redis", redis.port()}}) {
            fs::remove(proxy_dir + name + ".hang", ec);
            auto p = std::make_unique<cluster::HangProxy>(port);
            if (p->port() == 0) {
                return common::fail(fmt::format("--fault-proxies: cannot listen for {}'s proxy", name));
            }
            proxies[name] = std::move(p);
        }
    }
    const auto via = [&](const std::string & name) { return proxies.count(name) ? proxies[name]->port() : 0; };
    const std::string etcd_endpoint = via("etcd") ? "127.0.0.1:" + std::to_string(via("etcd")) : etcd.endpoint();
    const std::string nats_url = via("nats") ? "nats://127.0.0.1:" + std::to_string(via("nats")) : nats.url();
    const std::string redis_url = via("redis") ? "127.0.0.1:" + std::to_string(via("redis")) : redis.url();
    std::string pg_urls;
    json pg_url_list = json::array();
    for (const auto & db : databases) {
        const std::string u = via("postgres") ? pg.url_via(via("postgres"), db) : pg.url(db);
        pg_urls += (pg_urls.empty() ? "" : ", ") + json(u).dump();
        pg_url_list.push_back(u);
    }
    const std::string cfg_path = dir + "/cluster.yaml";
    {
        // With --tls each server is reached over TLS, checked against the cluster's CA
        // (PostgreSQL's URLs carry their own sslmode and sslrootcert).
        const std::string ca = o.tls ? ", ca_file: " + json(server_tls.ca_file).dump() : std::string();
        std::ostringstream f;
        f << "# written by armada cluster up\n"
          << "etcd: [" << etcd_endpoint << "]\n"
          << "nats: " << nats_url << "\n"
          << "redis: " << redis_url << "\n"
          << "postgres: [" << pg_urls << "]\n"
          << "credentials:\n"
          << "  etcd: {user: " << json(etcd.user()).dump() << ", password_file: " << json(etcd.password_file()).dump()
          << ca << "}\n"
          << "  nats: {user: " << json(nats.user()).dump() << ", password_file: " << json(nats.password_file()).dump()
          << ca << "}\n"
          << "  redis: {user: " << json(redis.user()).dump()
          << ", password_file: " << json(redis.password_file()).dump() << ca << "}\n"
          << (o.tls ? "  nodes: {ca_file: " + json(server_tls.ca_file).dump() + "}\n" : std::string())
          << "lease_ttl_s: " << o.lease_ttl_s << "\n"
          << "cells:\n";
        for (int c = 0; c < o.cells; ++c)
            f << "  - {name: cell" << c << "}\n";
        if (!routing.empty()) f << "# from --pools " << o.pools_file << "\n" << routing << "\n";
        // It names the servers' secret files: readable by root alone, like them.
        if (auto e = cluster::write_private(cfg_path, f.str()); !e.empty()) {
            return common::fail(e);
        }
    }

    const std::string exe = self_exe();
    const std::string peer_key = random_key();
    std::vector<cluster::SupervisedProc> procs;
    const int globals = o.globals >= 0 ? o.globals : (o.cells > 1 ? 2 : 0);
    for (int g = 0; g < globals; ++g) {
        cluster::SupervisedProc p;
        p.role = "global";
        p.name = "global" + std::to_string(g);
        p.log = logs + p.name + ".log";
        const int mport = cluster::free_port();
        p.url = "http://127.0.0.1:" + std::to_string(mport);  // its /metrics
        p.argv = {exe,    "global",         "--cluster",           cfg_path,      "--name",
                  p.name, "--metrics-port", std::to_string(mport), "--restarter", "cluster-up"};
        procs.push_back(std::move(p));
    }
    for (int c = 0; c < o.cells; ++c) {
        const std::string cell = "cell" + std::to_string(c);
        for (int b = 0; b < o.brains; ++b) {
            cluster::SupervisedProc p;
            p.role = "cell";
            p.name = cell + "-brain" + std::to_string(b);
            p.log = logs + p.name + ".log";
            const int mport = cluster::free_port();
            p.url = "http://127.0.0.1:" + std::to_string(mport);  // its /metrics
            p.argv = {exe,  "cell",   "--cluster", cfg_path,         "--cell",
                      cell, "--name", p.name,      "--metrics-port", std::to_string(mport)};
            procs.push_back(std::move(p));
        }
        for (int n = 0; n < o.nodes; ++n) {
            cluster::SupervisedProc p;
            p.role = "node";
            p.name = cell + "-node" + std::to_string(n);
            p.log = logs + p.name + ".log";
            const int port = cluster::free_port();
            p.url = std::string(o.tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(port);
            p.argv = {exe,           "serve",
                      "--cluster",   cfg_path,
                      "--cell",      cell,
                      "--node-name", p.name,
                      "-m",          o.model,
                      "--port",      std::to_string(port),
                      "--data-dir",  dir + "/nodes/" + p.name,
                      "--no-pin"};
            if (!o.agents_file.empty()) p.argv.insert(p.argv.end(), {"--agents", o.agents_file});
            if (!o.api_key_file.empty()) p.argv.insert(p.argv.end(), {"--api-key-file", o.api_key_file});
            // With --tls a node serves HTTPS (gateways and other nodes check it against the CA).
            if (o.tls)
                p.argv.insert(p.argv.end(),
                              {"--ssl-cert-file", server_tls.cert_file, "--ssl-key-file", server_tls.key_file});
            p.argv.insert(p.argv.end(), o.node_args.begin(), o.node_args.end());
            p.version = o.version_label;
            procs.push_back(std::move(p));
        }
    }
    const size_t first_gateway = procs.size();
    for (int i = 0; i < std::max(1, o.gateways); ++i) {
        cluster::SupervisedProc g;
        g.role = "gateway";
        g.name = i == 0 ? std::string("gateway") : "gateway" + std::to_string(i);
        g.log = logs + g.name + ".log";
        const int port = i == 0 && o.port > 0 ? o.port : cluster::free_port();
        g.url = std::string(o.tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(port);
        g.argv = {exe, "gateway", "--cluster", cfg_path, "--port", std::to_string(port), "--name", g.name};
        if (o.tls)
            g.argv.insert(g.argv.end(),
                          {"--ssl-cert-file", server_tls.cert_file, "--ssl-key-file", server_tls.key_file});
        g.argv.insert(g.argv.end(), o.gateway_args.begin(), o.gateway_args.end());
        if (!o.api_key_file.empty()) g.argv.insert(g.argv.end(), {"--api-key-file", o.api_key_file});
        procs.push_back(std::move(g));
    }
    // Each process with its environment: the admin key for nodes and gateways (not on the command
    // line, where `ps` shows it), the nodes' peer key, and a node's version arguments.
    class ChildLauncher final : public cluster::Launcher {
      public:
        ChildLauncher(const ClusterUpOptions & o, std::string peer_key) : o_(o), peer_key_(std::move(peer_key)) {}
        std::unique_ptr<cluster::ProcessHandle> spawn(const cluster::SupervisedProc & p, std::string & error) override {
            std::vector<std::string> env;
            if (!o_.api_key.empty() && (p.role == "node" || p.role == "gateway"))
                env.push_back("ARMADA_API_KEY=" + o_.api_key);
            // Nodes move sessions' KV between them with a key of their own, whether or not
            // clients need keys.
            if (p.role == "node") env.push_back("ARMADA_PEER_KEY=" + peer_key_);
            std::vector<std::string> argv = p.argv;
            if (p.role == "node" && !p.version.empty()) {
                // The version it runs now: its label, and the arguments given for it.
                argv.insert(argv.end(), {"--version-label", p.version});
                for (const auto & va : o_.version_args) {
                    const auto eq = va.find('=');
                    if (eq != std::string::npos && va.substr(0, eq) == p.version) argv.push_back(va.substr(eq + 1));
                }
            }
            auto c = Child::spawn(argv, p.log, "", error, env);
            if (!c) {
                fprintf(stderr, "error: cannot start %s: %s\n", p.name.c_str(), error.c_str());
                return nullptr;
            }
            return std::make_unique<Handle>(std::move(*c));
        }

      private:
        class Handle final : public cluster::ProcessHandle {
          public:
            explicit Handle(Child c) : c_(std::move(c)) {}
            int pid() const override { return c_.pid(); }
            bool running() override { return c_.running(); }
            int exit_code() const override { return c_.exit_code(); }
            void signal(int sig) override { c_.signal(sig); }
            void stop(int sig, int wait_ms) override { c_.stop(sig, wait_ms); }

          private:
            Child c_;
        };
        const ClusterUpOptions & o_;
        std::string peer_key_;
    };
    ChildLauncher launcher(o, peer_key);
    cluster::SupervisorConfig sc;
    sc.lease_ttl_s = o.lease_ttl_s;
    cluster::Supervisor sup(sc, launcher, cluster::real_clock());
    for (auto & p : procs)
        sup.add(std::move(p));
    const auto & all = sup.entries();
    auto write_status = [&] {
        json ps = json::array();
        for (const auto & e : all) {
            ps.push_back({{"role", e.proc.role},
                          {"name", e.proc.name},
                          {"pid", e.child ? e.child->pid() : -1},
                          {"url", e.proc.url},
                          {"log", e.proc.log},
                          {"version", e.proc.version}});
        }
        json gateways = json::array();
        for (size_t i = first_gateway; i < all.size(); ++i)
            gateways.push_back(all[i].proc.url);
        json servers = {{"postgres", {{"pid", pg.pid()}, {"url", pg.url("armada")}, {"shards", pg_url_list}}},
                        {"etcd",
                         {{"pid", etcd.pid()},
                          {"endpoint", etcd.endpoint()},
                          {"user", etcd.user()},
                          {"password_file", etcd.password_file()}}},
                        {"nats",
                         {{"pid", nats.pid()},
                          {"url", nats.url()},
                          {"user", nats.user()},
                          {"password_file", nats.password_file()}}},
                        {"redis",
                         {{"pid", redis.pid()},
                          {"url", redis.url()},
                          {"user", redis.user()},
                          {"password_file", redis.password_file()}}}};
        json proxy_list = json::object();
        for (const auto & [name, p] : proxies)
            proxy_list[name] = {{"port", p->port()}, {"hang_file", proxy_dir + name + ".hang"}};
        const std::string tmp = dir + "/cluster.json.tmp";
        std::ofstream(tmp) << json{
            {"gateway", all[first_gateway].proc.url},
            {"gateways", gateways},
            {"config", cfg_path},
            {"processes", ps},
            {"servers", servers},
            {"proxies",
             proxy_list}}.dump(2);
        fs::rename(tmp, dir + "/cluster.json", ec);
    };
    bool ok = sup.start_all();
    write_status();
    int sig = 0;
    if (ok) {
        // Ready when the gateway listens; the nodes load their model meanwhile.
        for (size_t g = first_gateway; ok && sig <= 0 && g < all.size(); ++g) {
            const int gport = std::stoi(all[g].proc.url.substr(all[g].proc.url.rfind(':') + 1));
            // (An HTTPS gateway is ready once it accepts connections.)
            auto ready = [&] { return o.tls ? cluster::port_open(gport) : http_ok(gport); };
            for (int i = 0; i < 600 && !ready(); ++i) {
                timespec t{0, 100 * 1000 * 1000};
                if ((sig = sigtimedwait(&stop_set, nullptr, &t)) > 0) break;
                if (!sup.entry(g).child->running()) break;
            }
            if (!ready()) {
                fprintf(stderr, "error: %s did not start; see %s:\n%s\n", all[g].proc.name.c_str(),
                        all[g].proc.log.c_str(), cluster::tail_of(all[g].proc.log).c_str());
                ok = false;
            }
        }
    }
    if (ok && sig <= 0) {
        printf("armada: cluster up: %d cell%s x %d nodes; gateway at %s\n", o.cells, o.cells > 1 ? "s" : "", o.nodes,
               all[first_gateway].proc.url.c_str());
        if (o.tls) printf("armada: clients trust %s/tls/ca.crt\n", dir.c_str());
        for (size_t g = first_gateway + 1; g < all.size(); ++g)
            printf("armada: %s at %s\n", all[g].proc.name.c_str(), all[g].proc.url.c_str());
        printf("armada: processes and logs are listed in %s/cluster.json; Ctrl-C stops everything\n", dir.c_str());
        fflush(stdout);
        // Supervise (cluster/runtime/supervisor.h): a server that dies comes back on the same
        // directory and port at once (tests kill them on purpose); an Armada process that crashes
        // comes back after its back-off; a rollout's restarts are carried out.
        sup.add_server(
            "postgresql", [&] { return pg.running(); }, [&] { return pg.restart(); });
        sup.add_server(
            "etcd", [&] { return etcd.running(); }, [&] { return etcd.restart(); });
        sup.add_server(
            "nats", [&] { return nats.running(); }, [&] { return nats.restart(); });
        sup.add_server(
            "redis", [&] { return redis.running(); }, [&] { return redis.restart(); });
        std::set<std::string> node_names;
        for (const auto & e : all)
            if (e.proc.role == "node") node_names.insert(e.proc.name);
        cluster::EtcdKvStore restart_kv(etcd.client(3000));
        cluster::RestartRequests restarts(restart_kv, cluster::ClusterConfig{}.prefix, node_names);
        restarts.start();
        sup.follow_restarts(&restarts);
        for (;;) {
            timespec t{0, 200 * 1000 * 1000};
            if ((sig = sigtimedwait(&stop_set, nullptr, &t)) > 0) break;
            if (sup.turn()) write_status();
            for (const auto & [name, p] : proxies) {
                const bool hang = fs::exists(proxy_dir + name + ".hang", ec);
                if (hang == p->hung()) continue;
                spdlog::warn("cluster up: {}'s proxy {}", name, hang ? "hangs (every byte held)" : "forwards again");
                hang ? p->hang() : p->resume();
            }
        }
        sup.follow_restarts(nullptr);
    }
    printf("armada: stopping the cluster\n");
    fflush(stdout);
    // In order: the entry first, then the nodes (they drain), the brains, the servers.
    sup.stop_all(40000);
    redis.stop();
    nats.stop();
    etcd.stop();
    pg.stop();
    return ok ? 0 : 1;
}

}  // namespace armada::cli

#include "cli/cluster_up.h"

#include "cli/stop_signals.h"

#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/local_servers.h"
#include "cluster/restarter.h"

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

struct Proc {
    std::string role, name, log, url;
    std::vector<std::string> argv;
    std::optional<Child> child;
    bool reported_exit = false;
    std::chrono::steady_clock::time_point restart_at{};  // when a crashed one starts again
    int restarts = 0;
    // Nodes: the version it runs (its argv is built at each launch), and a rollout's restart.
    std::string version;
    int64_t gen = 0;           // the last restart request carried out
    std::string next_version;  // asked for: it starts on this once it has exited
    bool expect_exit = false;  // it was told to stop for a restart
};

//! Rollouts' restart requests, read from etcd on a thread of its own (an etcd call can block
//! for seconds; the supervising loop must not), and the acknowledgements written back.
class RestartPoller {
  public:
    RestartPoller(cluster::EtcdClient etcd, std::set<std::string> nodes)
        : etcd_(std::move(etcd)), nodes_(std::move(nodes)) {
        thread_ = std::thread([this] { run(); });
    }
    ~RestartPoller() {
        {
            std::lock_guard lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    //! The latest request per node.
    std::map<std::string, cluster::RestartRequest> requests() {
        std::lock_guard lk(mu_);
        return requests_;
    }
    void ack(const std::string & node, const cluster::RestartAck & a) {
        std::lock_guard lk(mu_);
        acks_[node] = a;
    }

  private:
    void run() {
        pthread_setname_np(pthread_self(), "armada-restarts");
        const std::string prefix = cluster::rollout_prefix(cluster::ClusterConfig{});
        std::unique_lock lk(mu_);
        while (!stop_) {
            auto acks = std::move(acks_);
            acks_.clear();
            lk.unlock();
            std::map<std::string, cluster::RestartAck> unsent;
            for (const auto & [node, a] : acks) {
                if (auto e = etcd_.put(prefix + "restarted/" + node, cluster::encode_restart_ack(a)); !e.empty()) {
                    spdlog::warn("cluster up: acknowledging the restart of {}: {} (again in 1 s)", node, e);
                    unsent[node] = a;
                }
            }
            std::vector<cluster::EtcdKv> kvs;
            int64_t rev = 0;
            std::map<std::string, cluster::RestartRequest> got;
            const bool read = etcd_.list(prefix + "restart/", kvs, rev).empty();
            for (const auto & kv : kvs) {
                const std::string node = kv.key.substr(prefix.size() + 8);
                auto r = cluster::decode_restart_request(node, kv.value);
                if (!r) continue;
                // Requests already there when this `cluster up` started were for processes it did
                // not start (a data directory used again): not carried out again.
                if (first_read_) baseline_[node] = r->gen;
                if (const auto b = baseline_.find(node); b != baseline_.end() && r->gen <= b->second) continue;
                if (!nodes_.count(node)) {
                    // Not one of ours: said once per gen, so the rollout halts with a reason.
                    if (refused_[node] < r->gen) {
                        refused_[node] = r->gen;
                        etcd_.put(prefix + "restarted/" + node,
                                  cluster::encode_restart_ack({r->gen, r->version, 0, 0, "no node named " + node}));
                    }
                    continue;
                }
                got[node] = *r;
            }
            if (read) first_read_ = false;
            lk.lock();
            for (auto & [node, a] : unsent)
                acks_.try_emplace(node, a);
            if (read) requests_ = std::move(got);
            cv_.wait_for(lk, std::chrono::seconds(1), [&] { return stop_ || !acks_.empty(); });
        }
    }

    cluster::EtcdClient etcd_;
    std::set<std::string> nodes_;
    std::map<std::string, int64_t> refused_;
    std::map<std::string, int64_t> baseline_;  // node → the gen of a request older than this process
    bool first_read_ = true;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::map<std::string, cluster::RestartRequest> requests_;
    std::map<std::string, cluster::RestartAck> acks_;
    std::thread thread_;
};

int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

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
    const sigset_t stop_set = block_stop_signals();
    if (o.model.empty()) {
        fprintf(stderr, "error: no model given; use -m FILE\n");
        return 2;
    }
    if (o.cells < 1 || o.cells > 16 || o.nodes < 1 || o.nodes > 64 || o.brains < 1 || o.brains > 5) {
        fprintf(stderr, "error: --cells 1..16, --nodes 1..64 and --brains 1..5\n");
        return 2;
    }
    // GPU pools and routing rules (a part of a cluster file), checked before anything starts.
    std::string routing;
    if (!o.pools_file.empty()) {
        std::ifstream f(o.pools_file);
        if (!f) {
            fprintf(stderr, "error: cannot read --pools %s\n", o.pools_file.c_str());
            return 2;
        }
        std::stringstream ss;
        ss << f.rdbuf();
        routing = ss.str();
        if (routing.find("tokenizer:") == std::string::npos) routing += "\ntokenizer: " + o.model + "\n";
        std::string err;
        if (!cluster::parse_cluster_config("etcd: [x:1]\npostgres: [postgres://x]\n" + routing, err)) {
            fprintf(stderr, "error: --pools %s: %s\n", o.pools_file.c_str(), err.c_str());
            return 2;
        }
    }
    std::error_code ec;
    fs::create_directories(o.data_dir + "/logs", ec);
    if (ec) {
        fprintf(stderr, "error: cannot create %s: %s\n", o.data_dir.c_str(), ec.message().c_str());
        return 1;
    }
    const std::string dir = fs::absolute(o.data_dir).string();
    const std::string logs = dir + "/logs/";

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
            fprintf(stderr, "error: --tls: %s\n", err.c_str());
            return 1;
        }
        pg.use_tls(server_tls);
        etcd.use_tls(server_tls);
        nats.use_tls(server_tls);
        redis.use_tls(server_tls);
    }
    // Every server's secrets (passwords, the PostgreSQL passfile) live here, root's alone (0700
    // directory, 0600 files), and cluster.yaml only names them.
    const std::string secrets = dir + "/secrets";
    if (!up("postgresql", pg.start(dir + "/postgres", 0, secrets))) return 1;
    for (const auto & db : databases) {
        if (!up(("postgresql database " + db).c_str(), pg.create_database(db))) return 1;
    }
    std::ofstream(dir + "/postgres/shards") << o.pg_shards << "\n";
    if (!up("etcd", etcd.start(dir + "/etcd")) ||
        !up("etcd authentication", etcd.enable_auth(secrets, "armada", cluster::ClusterConfig{}.prefix)) ||
        !up("nats", nats.start(dir + "/nats", 0, secrets)) || !up("redis", redis.start(dir + "/redis", 0, secrets)))
        return 1;
    std::string pg_urls;
    json pg_url_list = json::array();
    for (const auto & db : databases) {
        pg_urls += (pg_urls.empty() ? "" : ", ") + json(pg.url(db)).dump();
        pg_url_list.push_back(pg.url(db));
    }
    const std::string cfg_path = dir + "/cluster.yaml";
    {
        // With --tls each server is reached over TLS, checked against the cluster's CA
        // (PostgreSQL's URLs carry their own sslmode and sslrootcert).
        const std::string ca = o.tls ? ", ca_file: " + json(server_tls.ca_file).dump() : std::string();
        std::ostringstream f;
        f << "# written by armada cluster up\n"
          << "etcd: [" << etcd.endpoint() << "]\n"
          << "nats: " << nats.url() << "\n"
          << "redis: " << redis.url() << "\n"
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
            fprintf(stderr, "error: %s\n", e.c_str());
            return 1;
        }
    }

    const std::string exe = self_exe();
    const std::string peer_key = random_key();
    std::vector<Proc> procs;
    auto launch = [&](Proc & p) {
        std::string err;
        // The admin key goes in the environment, not on the command line where `ps` shows it.
        std::vector<std::string> env;
        if (!o.api_key.empty() && (p.role == "node" || p.role == "gateway"))
            env.push_back("ARMADA_API_KEY=" + o.api_key);
        // Nodes move sessions' KV between them with a key of their own, whether or not clients
        // need keys.
        if (p.role == "node") env.push_back("ARMADA_PEER_KEY=" + peer_key);
        std::vector<std::string> argv = p.argv;
        if (p.role == "node" && !p.version.empty()) {
            // The version it runs now: its label, and the arguments given for it.
            argv.insert(argv.end(), {"--version-label", p.version});
            for (const auto & va : o.version_args) {
                const auto eq = va.find('=');
                if (eq != std::string::npos && va.substr(0, eq) == p.version) argv.push_back(va.substr(eq + 1));
            }
        }
        p.child = Child::spawn(argv, p.log, "", err, env);
        if (!p.child) fprintf(stderr, "error: cannot start %s: %s\n", p.name.c_str(), err.c_str());
        return p.child.has_value();
    };
    const int globals = o.globals >= 0 ? o.globals : (o.cells > 1 ? 2 : 0);
    for (int g = 0; g < globals; ++g) {
        Proc p;
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
            Proc p;
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
            Proc p;
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
        Proc g;
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
    Proc & gateway = procs[first_gateway];
    auto write_status = [&] {
        json ps = json::array();
        for (auto & p : procs) {
            ps.push_back({{"role", p.role},
                          {"name", p.name},
                          {"pid", p.child ? p.child->pid() : -1},
                          {"url", p.url},
                          {"log", p.log},
                          {"version", p.version}});
        }
        json gateways = json::array();
        for (size_t i = first_gateway; i < procs.size(); ++i)
            gateways.push_back(procs[i].url);
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
        const std::string tmp = dir + "/cluster.json.tmp";
        std::ofstream(tmp) << json{
            {"gateway", gateway.url},
            {"gateways", gateways},
            {"config", cfg_path},
            {"processes", ps},
            {"servers", servers}}.dump(2);
        fs::rename(tmp, dir + "/cluster.json", ec);
    };
    bool ok = true;
    for (auto & p : procs)
        ok = ok && launch(p);
    write_status();
    int sig = 0;
    if (ok) {
        // Ready when the gateway listens; the nodes load their model meanwhile.
        for (size_t g = first_gateway; ok && sig <= 0 && g < procs.size(); ++g) {
            const int gport = std::stoi(procs[g].url.substr(procs[g].url.rfind(':') + 1));
            // (An HTTPS gateway is ready once it accepts connections.)
            auto ready = [&] { return o.tls ? cluster::port_open(gport) : http_ok(gport); };
            for (int i = 0; i < 600 && !ready(); ++i) {
                timespec t{0, 100 * 1000 * 1000};
                if ((sig = sigtimedwait(&stop_set, nullptr, &t)) > 0) break;
                if (!procs[g].child->running()) break;
            }
            if (!ready()) {
                fprintf(stderr, "error: %s did not start; see %s:\n%s\n", procs[g].name.c_str(), procs[g].log.c_str(),
                        cluster::tail_of(procs[g].log).c_str());
                ok = false;
            }
        }
    }
    if (ok && sig <= 0) {
        printf("armada: cluster up: %d cell%s x %d nodes; gateway at %s\n", o.cells, o.cells > 1 ? "s" : "", o.nodes,
               gateway.url.c_str());
        if (o.tls) printf("armada: clients trust %s/tls/ca.crt\n", dir.c_str());
        for (size_t g = first_gateway + 1; g < procs.size(); ++g)
            printf("armada: %s at %s\n", procs[g].name.c_str(), procs[g].url.c_str());
        printf("armada: processes and logs are listed in %s/cluster.json; Ctrl-C stops everything\n", dir.c_str());
        fflush(stdout);
        // Supervise: a server that dies comes back on the same directory and port at once (tests
        // kill them on purpose). An Armada process that crashes comes back after a back-off of
        // at least twice the lease TTL (10 s at least, doubling per restart up to 5 min, as a
        // kubelet's): by then its lease has expired and its cell has moved its sessions, so the
        // node that returns is an empty one that joins again. One that exits 0 stays down.
        const auto backoff = [&](int restarts) {
            const int base = std::max(10, 2 * o.lease_ttl_s);
            return std::chrono::seconds(std::min(300, base << std::min(restarts, 5)));
        };
        std::set<std::string> node_names;
        for (const auto & p : procs)
            if (p.role == "node") node_names.insert(p.name);
        RestartPoller restarts(etcd.client(3000), node_names);
        for (;;) {
            timespec t{0, 200 * 1000 * 1000};
            if ((sig = sigtimedwait(&stop_set, nullptr, &t)) > 0) break;
            bool changed = false;
            auto revive = [&](const char * what, bool running, const std::function<std::string()> & restart) {
                if (running) return;
                spdlog::warn("cluster up: {} exited; starting it again", what);
                if (auto e = restart(); !e.empty()) spdlog::error("cluster up: {}: {}", what, e);
                changed = true;
            };
            revive("postgresql", pg.running(), [&] { return pg.restart(); });
            revive("etcd", etcd.running(), [&] { return etcd.restart(); });
            revive("nats", nats.running(), [&] { return nats.restart(); });
            revive("redis", redis.running(), [&] { return redis.restart(); });
            const auto now = std::chrono::steady_clock::now();
            // A rollout's restarts: SIGTERM (the node drains and exits), then a start on the
            // version asked for. A node already down starts on it at once.
            const auto asked = restarts.requests();
            for (auto & p : procs) {
                const auto r = asked.find(p.name);
                if (p.role != "node" || r == asked.end() || r->second.gen <= p.gen) continue;
                p.gen = r->second.gen;
                p.next_version = r->second.version;
                spdlog::info("cluster up: restarting {} on version {} (rollout gen {})", p.name, p.next_version, p.gen);
                if (p.child && p.child->running()) {
                    p.expect_exit = true;
                    p.child->signal(SIGTERM);
                } else {
                    p.expect_exit = true;
                    p.reported_exit = true;
                    p.restart_at = now;
                }
            }
            for (auto & p : procs) {
                if (p.child && !p.reported_exit && !p.child->running() && p.expect_exit) {
                    // Stopped for a restart, drained or not: up again on its new version after a
                    // jittered pause (many nodes restarted at once do not arrive at once).
                    p.reported_exit = true;
                    p.restart_at = now + std::chrono::milliseconds(cluster::jittered_ms(1000));
                    spdlog::info("cluster up: {} stopped (exit {}) for its restart", p.name, p.child->exit_code());
                    continue;
                }
                if (p.expect_exit && p.reported_exit && p.restart_at != std::chrono::steady_clock::time_point{} &&
                    now >= p.restart_at) {
                    p.restart_at = {};
                    p.expect_exit = false;
                    p.version = p.next_version;
                    cluster::RestartAck a{p.gen, p.version, 0, wall_ms(), ""};
                    if (launch(p)) {
                        p.reported_exit = false;
                        a.pid = p.child->pid();
                        spdlog::info("cluster up: {} started on version {} (pid {})", p.name, p.version, a.pid);
                    } else {
                        a.error = "cannot start " + p.name;
                    }
                    restarts.ack(p.name, a);
                    changed = true;
                    continue;
                }
                if (p.child && !p.reported_exit && !p.child->running()) {
                    p.reported_exit = true;
                    const int code = p.child->exit_code();
                    if (code == 0) {
                        spdlog::warn("cluster up: {} exited; see {}", p.name, p.log);
                        continue;
                    }
                    const auto wait = backoff(p.restarts);
                    p.restart_at = now + wait;
                    spdlog::warn("cluster up: {} {} {}; starting it again in {} s; see {}", p.name,
                                 code > 128 ? "was killed by signal" : "exited with", code > 128 ? code - 128 : code,
                                 wait.count(), p.log);
                } else if (p.reported_exit && p.restart_at != std::chrono::steady_clock::time_point{} &&
                           now >= p.restart_at) {
                    p.restart_at = {};
                    ++p.restarts;
                    if (launch(p)) {
                        p.reported_exit = false;
                        spdlog::info("cluster up: {} started again (pid {})", p.name, p.child->pid());
                    }
                    changed = true;
                }
            }
            if (changed) write_status();
        }
    }
    printf("armada: stopping the cluster\n");
    fflush(stdout);
    // In order: the entry first, then the nodes (they drain), the brains, the servers.
    for (const char * role : {"gateway", "node", "cell", "global"}) {
        for (auto & p : procs) {
            if (p.role == role && p.child && p.child->running()) p.child->signal(SIGTERM);
        }
        for (auto & p : procs) {
            if (p.role == role && p.child) p.child->stop(SIGTERM, 40000);
        }
    }
    redis.stop();
    nats.stop();
    etcd.stop();
    pg.stop();
    return ok ? 0 : 1;
}

}  // namespace armada::cli

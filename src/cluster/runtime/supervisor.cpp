#include "cluster/runtime/supervisor.h"
#include "common/backoff.h"

#include <spdlog/spdlog.h>

#include <pthread.h>
#include <algorithm>
#include <csignal>

namespace armada::cluster {

// ---- RestartRequests ----

namespace {
constexpr int kRestartsWaitMs = 250;          // the longest an acknowledgement waits to go out
constexpr int64_t kRestartsRelistMs = 60000;  // a fresh list now and then (a silently dead watch)
}  // namespace

RestartRequests::RestartRequests(KvStore & kv, std::string prefix, std::set<std::string> nodes, Clock & clock)
    : kv_(kv),
      keys_(std::move(prefix)),
      nodes_(std::move(nodes)),
      clock_(clock),
      informer_(kv, keys_.rollout() + "restart/", clock, kRestartsRelistMs) {}

RestartRequests::~RestartRequests() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void RestartRequests::start() {
    thread_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "armada-restarts");
        std::unique_lock lk(mu_);
        while (!stop_) {
            lk.unlock();
            // While the watch is up, the wait is on it: etcd is not read again at rest.
            const bool up = poll(kRestartsWaitMs);
            lk.lock();
            const auto pause =
                std::chrono::milliseconds(up ? 0 : std::clamp<int64_t>(informer_.retry_in_ms(), kRestartsWaitMs, 1000));
            cv_.wait_for(lk, pause, [&] { return stop_ || !acks_.empty(); });
        }
    });
}

std::map<std::string, RestartRequest> RestartRequests::requests() {
    std::lock_guard lk(mu_);
    return requests_;
}

void RestartRequests::ack(const std::string & node, const RestartAck & a) {
    {
        std::lock_guard lk(mu_);
        acks_[node] = a;
    }
    cv_.notify_all();
}

bool RestartRequests::poll(int wait_ms) {
    std::map<std::string, RestartAck> acks;
    {
        std::lock_guard lk(mu_);
        acks.swap(acks_);
    }
    // Those refused before go again once a second at most (a newer one for a node wins).
    const int64_t now = clock_.now_ms();
    if (!retry_.empty() && now >= retry_at_) {
        acks.merge(retry_);
        retry_.clear();
    }
    for (const auto & [node, a] : acks) {
        if (auto e = kv_.put(keys_.restart_ack(node), encode_restart_ack(a), 0); !e.empty()) {
            spdlog::warn("cluster up: acknowledging the restart of {}: {} (again in 1 s)", node, e);
            retry_[node] = a;
            retry_at_ = now + 1000;
        }
    }
    const int wait = retry_.empty() ? wait_ms : int(std::clamp<int64_t>(retry_at_ - now, 0, wait_ms));
    std::vector<EtcdEvent> changes;
    std::string error;
    const bool read = informer_.poll(changes, wait, error);
    if (!read && informer_.list_failed()) spdlog::debug("cluster up: restart requests: {}", error);
    std::map<std::string, RestartRequest> got;
    for (const auto & [key, kv] : informer_.view()) {
        const auto k = keys_.parse(kv.key);
        if (k.kind != ClusterKeys::Parsed::Kind::RestartRequest) continue;
        const std::string & node = k.name;
        auto r = decode_restart_request(node, kv.value);
        if (!r) continue;
        // Requests already there when this supervisor started were for processes it did not
        // start (a data directory used again): not carried out again.
        if (first_read_) baseline_[node] = r->gen;
        if (const auto b = baseline_.find(node); b != baseline_.end() && r->gen <= b->second) continue;
        if (!nodes_.count(node)) {
            // Not one of ours: said once per gen, so the rollout halts with a reason.
            if (refused_[node] < r->gen) {
                refused_[node] = r->gen;
                RestartAck no;
                no.gen = r->gen;
                no.version = r->version;
                no.error = "no node named " + node;
                kv_.put(keys_.restart_ack(node), encode_restart_ack(no), 0);
            }
            continue;
        }
        got[node] = *r;
    }
    if (read) first_read_ = false;
    std::lock_guard lk(mu_);
    if (read) requests_ = std::move(got);
    return read;
}

// ---- Supervisor ----

Supervisor::Supervisor(SupervisorConfig cfg, Launcher & launcher, Clock & clock)
    : cfg_(cfg), launcher_(launcher), clock_(clock) {}

size_t Supervisor::add(SupervisedProc p) {
    Entry e;
    e.proc = std::move(p);
    procs_.push_back(std::move(e));
    return procs_.size() - 1;
}

void Supervisor::add_server(std::string name, std::function<bool()> running, std::function<std::string()> restart) {
    servers_.push_back({std::move(name), std::move(running), std::move(restart)});
}

int64_t Supervisor::backoff_ms(int restarts) const {
    const int base = std::max(10, 2 * cfg_.lease_ttl_s);
    return common::backoff_ms(base, restarts, 300) * 1000;
}

bool Supervisor::launch(Entry & e) {
    std::string err;
    e.child = launcher_.spawn(e.proc, err);
    if (!e.child) spdlog::error("cannot start {}: {}", e.proc.name, err);
    return e.child != nullptr;
}

bool Supervisor::start_all() {
    bool ok = true;
    for (auto & e : procs_)
        ok = ok && launch(e);  // the first that cannot start stops the rest
    return ok;
}

bool Supervisor::turn() {
    bool changed = false;
    for (auto & s : servers_) {
        if (s.running()) continue;
        spdlog::warn("cluster up: {} exited; starting it again", s.name);
        if (auto e = s.restart(); !e.empty()) spdlog::error("cluster up: {}: {}", s.name, e);
        changed = true;
    }
    const int64_t now = clock_.now_ms();
    // A rollout's restarts: SIGTERM (the node drains and exits), then a start on the version
    // asked for. A node already down starts on it at once.
    if (restarts_) {
        const auto asked = restarts_->requests();
        for (auto & p : procs_) {
            const auto r = asked.find(p.proc.name);
            if (p.proc.role != "node" || r == asked.end() || r->second.gen <= p.gen) continue;
            p.gen = r->second.gen;
            p.next_version = r->second.version;
            spdlog::info("cluster up: restarting {} on version {} (rollout gen {})", p.proc.name, p.next_version,
                         p.gen);
            p.expect_exit = true;
            if (p.child && p.child->running()) {
                p.child->signal(SIGTERM);
            } else {
                p.reported_exit = true;
                p.restart_at = now;
            }
        }
    }
    for (auto & p : procs_) {
        if (p.child && !p.reported_exit && p.expect_exit && !p.child->running()) {
            // Stopped for a restart, drained or not: up again on its new version after a
            // jittered pause (many nodes restarted at once do not arrive at once).
            p.reported_exit = true;
            p.restart_at = now + jitter_.next_ms();
            spdlog::info("cluster up: {} stopped (exit {}) for its restart", p.proc.name, p.child->exit_code());
            continue;
        }
        if (p.expect_exit && p.reported_exit && p.restart_at != 0 && now >= p.restart_at) {
            p.restart_at = 0;
            p.expect_exit = false;
            p.proc.version = p.next_version;
            RestartAck a;
            a.gen = p.gen;
            a.version = p.proc.version;
            a.at_ms = clock_.wall_ms();
            if (launch(p)) {
                p.reported_exit = false;
                a.pid = p.child->pid();
                spdlog::info("cluster up: {} started on version {} (pid {})", p.proc.name, p.proc.version, a.pid);
            } else {
                a.error = "cannot start " + p.proc.name;
            }
            if (restarts_) restarts_->ack(p.proc.name, a);
            changed = true;
            continue;
        }
        if (p.child && !p.reported_exit && !p.child->running()) {
            p.reported_exit = true;
            const int code = p.child->exit_code();
            if (code == 0) {
                spdlog::warn("cluster up: {} exited; see {}", p.proc.name, p.proc.log);
                continue;
            }
            const int64_t wait = backoff_ms(p.restarts);
            p.restart_at = now + wait;
            spdlog::warn("cluster up: {} {} {}; starting it again in {} s; see {}", p.proc.name,
                         code > 128 ? "was killed by signal" : "exited with", code > 128 ? code - 128 : code,
                         wait / 1000, p.proc.log);
        } else if (p.reported_exit && p.restart_at != 0 && now >= p.restart_at) {
            p.restart_at = 0;
            ++p.restarts;
            if (launch(p)) {
                p.reported_exit = false;
                spdlog::info("cluster up: {} started again (pid {})", p.proc.name, p.child->pid());
            }
            changed = true;
        }
    }
    return changed;
}

void Supervisor::stop_all(int wait_ms) {
    for (const char * role : {"gateway", "node", "cell", "global"}) {
        for (auto & p : procs_)
            if (p.proc.role == role && p.child && p.child->running()) p.child->signal(SIGTERM);
        for (auto & p : procs_)
            if (p.proc.role == role && p.child) p.child->stop(SIGTERM, wait_ms);
    }
}

}  // namespace armada::cluster

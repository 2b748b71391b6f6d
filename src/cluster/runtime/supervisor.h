#pragma once

// The supervisor of a cluster's processes on one machine (`armada cluster up`): it starts them,
// brings back a server that dies at once and an Armada process that crashes after a back-off
// (by then its lease has gone and its cell has moved its sessions), leaves one that exited 0
// down, and carries out a rollout's restarts (request keys in etcd, acknowledged there). It talks
// to seams (Launcher for processes, KvStore, Clock), so unit tests drive it with fakes.

#include "cluster/restarter.h"
#include "cluster/runtime/clock.h"
#include "cluster/runtime/informer.h"
#include "cluster/runtime/keys.h"
#include "cluster/runtime/kv.h"
#include "common/backoff.h"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace armada::cluster {

//! A process as the supervisor keeps it.
struct SupervisedProc {
    std::string role;  // "node", "cell", "global", "gateway"
    std::string name, log, url;
    std::vector<std::string> argv;
    std::string version;  // nodes: the version it runs (its launch adds what that version needs)
};

class ProcessHandle {
  public:
    virtual ~ProcessHandle() = default;
    virtual int pid() const = 0;
    virtual bool running() = 0;
    //! Once it is not running: its exit code, or 128 + the signal that killed it.
    virtual int exit_code() const = 0;
    virtual void signal(int sig) = 0;
    //! Sends `sig`, waits up to `wait_ms`, then kills it.
    virtual void stop(int sig, int wait_ms) = 0;
};

class Launcher {
  public:
    virtual ~Launcher() = default;
    //! Starts `p` (null with `error` when it cannot).
    virtual std::unique_ptr<ProcessHandle> spawn(const SupervisedProc & p, std::string & error) = 0;
};

//! Rollouts' restart requests, followed in the key-value store (a list, then a watch: no reads at
//! rest), and the acknowledgements written back. `poll` does one round; `start` runs rounds on a
//! thread of its own (a call can block for seconds; the supervising loop must not).
class RestartRequests {
  public:
    RestartRequests(KvStore & kv, std::string prefix, std::set<std::string> nodes, Clock & clock = real_clock());
    ~RestartRequests();
    RestartRequests(const RestartRequests &) = delete;
    RestartRequests & operator=(const RestartRequests &) = delete;
    void start();
    //! Sends the acknowledgements waiting, then brings the requests up to date, waiting up to
    //! `wait_ms` for a change. False while the requests cannot be read (the last ones stay).
    bool poll(int wait_ms = 0);
    //! The latest request per node of ours.
    std::map<std::string, RestartRequest> requests();
    void ack(const std::string & node, const RestartAck & a);

  private:
    KvStore & kv_;
    ClusterKeys keys_;
    std::set<std::string> nodes_;
    Clock & clock_;
    Informer informer_;  // the request keys (acknowledgements live elsewhere)
    //! Acknowledgements etcd refused, sent again from `retry_at_` (poll's thread only).
    std::map<std::string, RestartAck> retry_;
    int64_t retry_at_ = 0;
    std::map<std::string, int64_t> refused_;
    std::map<std::string, int64_t> baseline_;  // node → the gen of a request older than this process
    bool first_read_ = true;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::map<std::string, RestartRequest> requests_;
    std::map<std::string, RestartAck> acks_;
    std::thread thread_;
};

struct SupervisorConfig {
    int lease_ttl_s = 10;
};

class Supervisor {
  public:
    Supervisor(SupervisorConfig cfg, Launcher & launcher, Clock & clock);
    //! A process to run; returns its index.
    size_t add(SupervisedProc p);
    //! A server (PostgreSQL, etcd, …) brought back at once when it is not running.
    void add_server(std::string name, std::function<bool()> running, std::function<std::string()> restart);
    //! Where rollouts' restart requests come from (none: no rollout restarts here).
    void follow_restarts(RestartRequests * r) { restarts_ = r; }
    //! Starts every process; false if one could not start.
    bool start_all();
    //! One pass: dead servers back, crashed processes back after their back-off, restarts asked
    //! for carried out. True when a process changed (its pid: write the status again).
    bool turn();
    //! Stops every process, the entry first, then the nodes (they drain), the brains.
    void stop_all(int wait_ms);

    struct Entry {
        SupervisedProc proc;
        std::unique_ptr<ProcessHandle> child;
        bool reported_exit = false;
        int64_t restart_at = 0;  // when a crashed one starts again (0: not waiting)
        int restarts = 0;
        int64_t gen = 0;           // the last restart request carried out
        std::string next_version;  // asked for: it starts on this once it has exited
        bool expect_exit = false;  // it was told to stop for a restart
    };
    const std::vector<Entry> & entries() const { return procs_; }
    Entry & entry(size_t i) { return procs_.at(i); }
    //! The pause before a crashed process starts again after `restarts` restarts: at least twice
    //! the lease TTL (10 s at least), doubling per restart up to 5 minutes, as a kubelet's.
    int64_t backoff_ms(int restarts) const;

  private:
    bool launch(Entry & e);

    SupervisorConfig cfg_;
    Launcher & launcher_;
    Clock & clock_;
    RestartRequests * restarts_ = nullptr;
    std::vector<Entry> procs_;
    struct Server {
        std::string name;
        std::function<bool()> running;
        std::function<std::string()> restart;
    };
    std::vector<Server> servers_;
    common::Backoff jitter_{1000, 1000};  // a restarted node comes back after a jittered pause
};

}  // namespace armada::cluster

#pragma once

// A MemoryKv on the real clock whose leases expire as etcd's would, for unit tests of code that
// keeps leases with threads of its own.

#include "cluster/runtime/clock.h"
#include "cluster/runtime/kv.h"

#include <atomic>
#include <chrono>
#include <thread>

namespace armada::cluster {

//! A thread asks the store every 20 ms to end the leases whose TTL ran out.
class LiveKv {
  public:
    LiveKv()
        : kv(&real_clock()), t_([this] {
              while (!stop_.load()) {
                  kv.expire_leases();
                  std::this_thread::sleep_for(std::chrono::milliseconds(20));
              }
          }) {}
    ~LiveKv() {
        stop_ = true;
        t_.join();
    }
    LiveKv(const LiveKv &) = delete;
    LiveKv & operator=(const LiveKv &) = delete;
    MemoryKv kv;

  private:
    std::atomic<bool> stop_{false};
    std::thread t_;
};

//! Passes every call to another store; a test overrides the calls it breaks.
class ForwardingKv : public KvStore {
  public:
    explicit ForwardingKv(KvStore & inner) : in_(inner) {}
    std::string get(const std::string & k, std::optional<EtcdKv> & o) override { return in_.get(k, o); }
    std::string list(const std::string & p, std::vector<EtcdKv> & o, int64_t & r) override { return in_.list(p, o, r); }
    std::string put(const std::string & k, const std::string & v, int64_t l) override { return in_.put(k, v, l); }
    std::string erase(const std::string & k) override { return in_.erase(k); }
    std::string erase_if_created(const std::string & k, int64_t rev, bool & erased) override {
        return in_.erase_if_created(k, rev, erased);
    }
    std::string txn(const std::vector<EtcdCompare> & c, const std::vector<std::pair<std::string, std::string>> & p,
                    bool & ok, int64_t & r) override {
        return in_.txn(c, p, ok, r);
    }
    std::unique_ptr<KvWatch> watch(const std::string & p, int64_t from) override { return in_.watch(p, from); }
    std::string status(EtcdStatus & o, bool & a) override { return in_.status(o, a); }
    std::string lease_grant(int64_t ttl, int64_t & l) override { return in_.lease_grant(ttl, l); }
    std::string lease_keepalive(int64_t l, bool & alive) override { return in_.lease_keepalive(l, alive); }
    std::string lease_revoke(int64_t l) override { return in_.lease_revoke(l); }

  protected:
    KvStore & in_;
};

}  // namespace armada::cluster

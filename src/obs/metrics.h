#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace armada::obs {

using Labels = std::vector<std::pair<std::string, std::string>>;

//! Monotonic counter. Thread-safe, lock-free.
class Counter {
  public:
    void inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
    uint64_t value() const { return v_.load(std::memory_order_relaxed); }

  private:
    std::atomic<uint64_t> v_{0};
};

//! Value that goes up and down. Thread-safe, lock-free.
class Gauge {
  public:
    void set(double v) { v_.store(v, std::memory_order_relaxed); }
    void add(double d);
    double value() const { return v_.load(std::memory_order_relaxed); }

  private:
    std::atomic<double> v_{0};
};

//! Cumulative histogram with fixed upper bounds (seconds or counts). Thread-safe.
class Histogram {
  public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double v);
    //! Counts per bucket (non-cumulative), sum and count, read consistently.
    void snapshot(std::vector<uint64_t> & buckets, double & sum, uint64_t & count) const;
    const std::vector<double> & bounds() const { return bounds_; }

  private:
    std::vector<double> bounds_;
    mutable std::mutex mu_;
    std::vector<uint64_t> counts_;  // bounds_.size() + 1, last is +Inf
    double sum_ = 0;
    uint64_t count_ = 0;
};

//! Named metric families with labels, rendered in Prometheus text format 0.0.4.
//! Lookup takes a lock; callers on hot paths keep the returned reference, which stays valid
//! for the registry's lifetime.
class Registry {
  public:
    Counter & counter(const std::string & name, const std::string & help, const Labels & labels = {});
    //! Brings a counter up to `total`, a running total kept elsewhere (engines, stores): counters
    //! only go up, so a smaller total changes nothing.
    void sync_counter(const std::string & name, const std::string & help, uint64_t total, const Labels & labels = {}) {
        auto & c = counter(name, help, labels);
        if (total > c.value()) c.inc(total - c.value());
    }
    Gauge & gauge(const std::string & name, const std::string & help, const Labels & labels = {});
    Histogram & histogram(const std::string & name, const std::string & help, const std::vector<double> & bounds,
                          const Labels & labels = {});
    std::string render() const;
    //! Removes every family whose name starts with `prefix` (a brain that stops leading stops
    //! exporting what only a leader knows). References to their metrics become invalid.
    void erase_families(const std::string & prefix);

  private:
    struct Family {
        std::string type, help;
        std::map<std::string, std::unique_ptr<Counter>> counters;
        std::map<std::string, std::unique_ptr<Gauge>> gauges;
        std::map<std::string, std::unique_ptr<Histogram>> histograms;
    };
    Family & family(const std::string & name, const char * type, const std::string & help);

    mutable std::mutex mu_;
    std::map<std::string, Family> families_;
};

//! A connection pool's figures as `<prefix>_*` metrics (PostgreSQL's read pools, Redis): an
//! exhausted pool is a classic outage, so its waits show. `P` has the fields of store::PoolStats.
template <class P>
void pool_metrics(Registry & m, const std::string & prefix, const P & p) {
    m.gauge(prefix + "_connections", "Connections opened at start").set(double(p.size));
    m.gauge(prefix + "_in_use", "Connections taken now").set(double(p.in_use));
    m.sync_counter(prefix + "_acquired_total", "Calls that took a connection", p.acquired);
    m.sync_counter(prefix + "_waits_total", "Calls that found no free connection and waited", p.waited);
    m.gauge(prefix + "_wait_seconds", "Time calls have spent waiting for a connection").set(double(p.wait_us) / 1e6);
    m.sync_counter(prefix + "_timeouts_total", "Calls that gave up waiting for a connection", p.timeouts);
    m.sync_counter(prefix + "_reconnects_total", "Connections opened again after the server went away", p.reconnects);
}

//! Renders labels as `{k="v",...}` with Prometheus escaping; empty for no labels.
std::string format_labels(const Labels & labels);

//! Bucket bounds in seconds suited to token latencies (1 ms .. 60 s).
std::vector<double> latency_buckets();

}  // namespace armada::obs

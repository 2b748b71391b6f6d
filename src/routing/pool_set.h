#pragma once

#include "obs/metrics.h"
#include "routing/rules.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace armada::routing {

//! The salt for `tenant`'s requests to a pool that keys its prompt cache by one: the same for
//! every gateway and node, and no tenant can send another's (a client's own `cache_salt` never
//! passes).
std::string tenant_cache_salt(const std::string & tenant);

//! A slot taken on one upstream for one request; give it back with `PoolSet::release`.
struct PoolLease {
    std::string pool;
    std::string url;    // the upstream's base
    std::string model;  // what to ask it for
    std::string key;    // its API key ("" for none); never the client's
    GrammarDialect grammar = GrammarDialect::llama;
    int timeout_ms = 0;
    uint64_t id = 0;          // which upstream entry (a reload may replace one with the same URL)
    bool cache_salt = false;  // it takes a per-tenant `cache_salt`
};

//! How a request sent to an upstream ended, for its breaker.
enum class PoolOutcome {
    ok,         // it answered (any status a client error explains, 2xx-4xx but 429)
    busy,       // 429: no fault, but it took nothing
    failed,     // no answer, a timeout, or a 5xx
    cancelled,  // the client went away: says nothing of the upstream
};

//! The live state of the GPU pools (or any OpenAI-compatible upstreams) a gateway routes to.
//! Upstreams take traffic only once their /health answers and a tiny request has warmed them.
//! Each has a circuit breaker: `breaker_errors` failures in a row open it for `breaker_open_ms`,
//! then a probe (health, then the tiny request) closes it again. `reload` drains upstreams no
//! longer listed: they take nothing new and are dropped once their last request ends.
//! Thread-safe; a thread of its own runs the checks.
class PoolSet {
  public:
    //! Reads every upstream's key (its environment variable or file). nullptr with `error`
    //! naming the upstream when one cannot be read.
    static std::unique_ptr<PoolSet> open(const std::vector<PoolConfig> & pools, std::string & error);
    ~PoolSet();

    void start();
    void stop();
    //! New pool settings (the cluster file read again): new upstreams warm first, removed ones drain.
    std::string reload(const std::vector<PoolConfig> & pools);

    enum class Unavailable { none, down, full };
    //! A slot on the upstream of `pool` with the fewest requests in flight among those ready
    //! (healthy, warmed, breaker closed, below max_in_flight), leaving out `avoid` (URLs tried
    //! already) and, when `need_llama_grammar`, those that only take OpenAI's `response_format`.
    //! nullopt with `why`: none is up (`down`), or all are at max_in_flight (`full`).
    std::optional<PoolLease> acquire(const std::string & pool, const std::set<std::string> & avoid,
                                     bool need_llama_grammar, Unavailable & why);
    //! Gives the slot back. `head_s` is how long the upstream took to answer (its latency).
    void release(const PoolLease & l, PoolOutcome outcome, double head_s);

    //! Waits until every upstream has had its first check (up or down), at most `timeout_ms`;
    //! false when some are still warming then.
    bool wait_warm(int timeout_ms);

    //! The pool's context (0: not known) and whether it exists.
    bool has(const std::string & pool) const;
    int64_t context(const std::string & pool) const;
    std::vector<std::string> names() const;

    //! Each pool: how many upstreams are up, and with `detail` each upstream's URL and state
    //! (/admin/pools), else only how many there are (/readyz, which needs no key).
    nlohmann::json status(bool detail = true) const;
    //! The pools' metrics: armada_gateway_pool_* (or the prefix given to set_metrics_prefix).
    std::string render_metrics() const;
    //! Names the metrics `prefix` + "upstream_up" and so on; call before start. A node that sends
    //! agent steps to the pools uses "armada_node_pool_".
    void set_metrics_prefix(std::string prefix) { prefix_ = std::move(prefix); }
    //! How many times each upstream's breaker has opened (tests, the status).
    uint64_t breaker_opened(const std::string & pool) const;

    //! Tests: sends one request (method, URL, body with headers) and returns the status (0: none).
    using Probe = std::function<int(const std::string & method, const std::string & url, const std::string & body,
                                    const std::string & key, int timeout_ms)>;
    void set_probe(Probe p) { probe_ = std::move(p); }

  private:
    struct Upstream {
        UpstreamConfig cfg;
        std::string key;
        uint64_t id = 0;
        enum class State { warming, up, down, open } state = State::warming;
        bool removed = false;  // draining: takes nothing new
        int in_flight = 0;
        int fails = 0;  // in a row
        int64_t open_until_ms = 0;
        int64_t next_check_ms = 0;
        uint64_t opened = 0, ok = 0, failed = 0, busy = 0;
    };
    struct Pool {
        PoolConfig cfg;
        std::vector<std::shared_ptr<Upstream>> ups;
    };
    PoolSet() = default;
    static const char * state_name(Upstream::State s);
    std::string read_keys(std::vector<PoolConfig> & pools, std::vector<std::vector<std::string>> & keys);
    void check_loop();
    //! Health, then the tiny request: true when the upstream can take traffic.
    bool check(const Pool & p, const Upstream & u);

    std::string prefix_ = "armada_gateway_pool_";
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Pool> pools_;  // mu_
    uint64_t next_id_ = 1;     // mu_
    bool stop_ = false;        // mu_
    std::thread checker_;
    Probe probe_;
    mutable obs::Registry metrics_;  // latency histograms (kept across renders)
};

}  // namespace armada::routing

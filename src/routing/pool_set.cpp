#include "routing/pool_set.h"

#include "common/clock.h"
#include "routing/upstream.h"

#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>

namespace armada::routing {

namespace {

int default_probe(const std::string & method, const std::string & url, const std::string & body,
                  const std::string & key, int timeout_ms) {
    // url is base + path: split at the path.
    const size_t slash = url.find('/', url.find("//") + 2);
    const std::string base = slash == std::string::npos ? url : url.substr(0, slash);
    const std::string path = slash == std::string::npos ? "/" : url.substr(slash);
    HeaderList h{{"content-type", "application/json"}};
    if (!key.empty()) h.emplace_back("authorization", "Bearer " + key);
    return forward(base, method, path, h, body, timeout_ms).status;
}

}  // namespace

std::string tenant_cache_salt(const std::string & tenant) {
    const std::string in = "armada-cache-salt\x1f" + tenant;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_Digest(in.data(), in.size(), md, &n, EVP_sha256(), nullptr);
    static const char * d = "0123456789abcdef";
    std::string s;
    for (unsigned int i = 0; i < 16 && i < n; ++i) {
        s += d[md[i] >> 4];
        s += d[md[i] & 15];
    }
    return s;
}

const char * PoolSet::state_name(Upstream::State s) {
    switch (s) {
        case Upstream::State::warming:
            return "warming";
        case Upstream::State::up:
            return "up";
        case Upstream::State::down:
            return "down";
        case Upstream::State::open:
            return "open";
    }
    return "?";
}

std::string PoolSet::read_keys(std::vector<PoolConfig> & pools, std::vector<std::vector<std::string>> & keys) {
    keys.clear();
    for (const auto & p : pools) {
        keys.emplace_back();
        for (size_t i = 0; i < p.upstreams.size(); ++i) {
            const auto & u = p.upstreams[i];
            const std::string where = "pools." + p.name + ".upstreams[" + std::to_string(i) + "]";
            std::string key;
            if (!u.api_key_env.empty()) {
                const char * v = std::getenv(u.api_key_env.c_str());
                if (!v || !*v) return where + ": the environment variable " + u.api_key_env + " is not set";
                key = v;
            } else if (!u.api_key_file.empty()) {
                std::ifstream f(u.api_key_file);
                if (!f) return where + ": cannot read api_key_file " + u.api_key_file;
                std::getline(f, key);
                while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t'))
                    key.pop_back();
                if (key.empty()) return where + ": api_key_file " + u.api_key_file + " is empty";
            }
            keys.back().push_back(std::move(key));
        }
    }
    return {};
}

std::unique_ptr<PoolSet> PoolSet::open(const std::vector<PoolConfig> & pools, std::string & error) {
    std::unique_ptr<PoolSet> s(new PoolSet());
    s->probe_ = default_probe;
    error = s->reload(pools);
    if (!error.empty()) return nullptr;
    return s;
}

PoolSet::~PoolSet() {
    stop();
}

std::string PoolSet::reload(const std::vector<PoolConfig> & pools_in) {
    auto pools = pools_in;
    std::vector<std::vector<std::string>> keys;
    if (auto e = read_keys(pools, keys); !e.empty()) return e;
    std::lock_guard lk(mu_);
    std::vector<Pool> next;
    for (size_t pi = 0; pi < pools.size(); ++pi) {
        Pool np;
        np.cfg = pools[pi];
        const Pool * old = nullptr;
        for (const auto & o : pools_) {
            if (o.cfg.name == np.cfg.name) old = &o;
        }
        for (size_t ui = 0; ui < np.cfg.upstreams.size(); ++ui) {
            const auto & uc = np.cfg.upstreams[ui];
            std::shared_ptr<Upstream> kept;
            if (old) {
                for (const auto & u : old->ups) {
                    // The same server with the same settings keeps its state (warm, breaker).
                    if (!u->removed && u->cfg.url == uc.url && u->cfg.model == uc.model && u->key == keys[pi][ui])
                        kept = u;
                }
            }
            if (kept) {
                kept->cfg = uc;  // max_in_flight and the dialect may change in place
            } else {
                kept = std::make_shared<Upstream>();
                kept->cfg = uc;
                kept->key = keys[pi][ui];
                kept->id = next_id_++;
            }
            np.ups.push_back(kept);
        }
        if (old) {
            // Those no longer listed drain: they stay until their requests end.
            for (const auto & u : old->ups) {
                if (std::find(np.ups.begin(), np.ups.end(), u) == np.ups.end() && u->in_flight > 0) {
                    if (!u->removed)
                        spdlog::info("gateway: pool {}: draining {} ({} in flight)", np.cfg.name, u->cfg.url,
                                     u->in_flight);
                    u->removed = true;
                    np.ups.push_back(u);
                }
            }
        }
        next.push_back(std::move(np));
    }
    for (const auto & o : pools_) {
        if (std::none_of(next.begin(), next.end(), [&](const Pool & p) { return p.cfg.name == o.cfg.name; })) {
            Pool gone;
            gone.cfg = o.cfg;
            for (const auto & u : o.ups) {
                if (u->in_flight > 0) {
                    u->removed = true;
                    gone.ups.push_back(u);
                }
            }
            if (!gone.ups.empty()) {
                gone.cfg.name = o.cfg.name;
                next.push_back(std::move(gone));
            }
        }
    }
    pools_ = std::move(next);
    cv_.notify_all();
    return {};
}

void PoolSet::start() {
    checker_ = std::thread([this] { check_loop(); });
}

void PoolSet::stop() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (checker_.joinable()) checker_.join();
}

bool PoolSet::check(const Pool & p, const Upstream & u) {
    const int health_timeout = std::min(p.cfg.timeout_ms, 5000);
    const int h = probe_("GET", u.cfg.url + "/health", "", u.key, health_timeout);
    if (h != 200) return false;
    if (u.state == Upstream::State::up) return true;  // warmed already: its health is enough
    // Before it takes traffic (first, or again after a failure), a tiny request warms it (a
    // first request may load kernels or weights) and proves the model name and the key. A 429
    // says the same: it knows the key and the model, and is busy.
    const nlohmann::json warm = {
        {"model", u.cfg.model}, {"messages", {{{"role", "user"}, {"content", "ping"}}}}, {"max_tokens", 1}};
    const int w =
        probe_("POST", u.cfg.url + "/v1/chat/completions", warm.dump(), u.key, std::min(p.cfg.timeout_ms, 30000));
    return w == 200 || w == 429;
}

void PoolSet::check_loop() {
    std::unique_lock lk(mu_);
    while (!stop_) {
        const int64_t t = common::steady_ms();
        // One due upstream at a time, checked without the lock.
        std::shared_ptr<Upstream> due;
        const Pool * pool = nullptr;
        // A pool the file no longer lists goes once its last upstream has drained.
        std::erase_if(pools_, [](const Pool & p) {
            return std::all_of(p.ups.begin(), p.ups.end(),
                               [](const auto & u) { return u->removed && u->in_flight == 0; });
        });
        for (auto & p : pools_) {
            std::erase_if(p.ups, [](const auto & u) { return u->removed && u->in_flight == 0; });
            for (auto & u : p.ups) {
                if (u->removed || u->next_check_ms > t) continue;
                if (u->state == Upstream::State::open && u->open_until_ms > t) continue;
                if (!due || u->next_check_ms < due->next_check_ms) {
                    due = u;
                    pool = &p;
                }
            }
        }
        if (!due) {
            cv_.wait_for(lk, std::chrono::milliseconds(100));
            continue;
        }
        const Pool copy{pool->cfg, {}};
        const Upstream snapshot = *due;
        lk.unlock();
        const bool ok = check(copy, snapshot);
        lk.lock();
        const auto before = due->state;
        if (before != snapshot.state) {
            // Requests changed its state meanwhile (its breaker opened): that is newer news than
            // a check that began before it.
            continue;
        }
        if (ok) {
            if (before != Upstream::State::up) {
                due->fails = 0;
                spdlog::info("gateway: pool {}: {} is up ({})", copy.cfg.name, due->cfg.url,
                             before == Upstream::State::open ? "its breaker closes" : "warmed");
            }
            due->state = Upstream::State::up;
        } else if (before == Upstream::State::up || before == Upstream::State::warming) {
            spdlog::warn("gateway: pool {}: {} failed its health check; it takes no requests until it passes",
                         copy.cfg.name, due->cfg.url);
            due->state = Upstream::State::down;
        } else if (before == Upstream::State::open) {
            due->open_until_ms = common::steady_ms() + copy.cfg.breaker_open_ms;  // still failing: stays open
        }
        const bool healthy = due->state == Upstream::State::up && copy.cfg.up_health_ms > 0;
        due->next_check_ms = common::steady_ms() + (healthy ? copy.cfg.up_health_ms : copy.cfg.health_ms);
        // An open breaker is probed again when its open time ends (half-open), not a health
        // period later: with a long health_ms an upstream that was still restarting at its
        // first probe would otherwise stay out for that long.
        if (due->state == Upstream::State::open) due->next_check_ms = due->open_until_ms;
        cv_.notify_all();  // wait_warm
    }
}

bool PoolSet::wait_warm(int timeout_ms) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] {
        for (const auto & p : pools_) {
            for (const auto & u : p.ups) {
                if (!u->removed && u->state == Upstream::State::warming) return false;
            }
        }
        return true;
    });
}

std::optional<PoolLease> PoolSet::acquire(const std::string & pool, const std::set<std::string> & avoid,
                                          bool need_llama_grammar, Unavailable & why) {
    std::lock_guard lk(mu_);
    why = Unavailable::down;
    for (auto & p : pools_) {
        if (p.cfg.name != pool) continue;
        Upstream * best = nullptr;
        bool any_up = false;
        for (auto & u : p.ups) {
            if (u->removed || u->state != Upstream::State::up || avoid.count(u->cfg.url)) continue;
            if (need_llama_grammar && u->cfg.grammar != GrammarDialect::llama) continue;
            any_up = true;
            if (u->in_flight >= u->cfg.max_in_flight) continue;
            if (!best || u->in_flight < best->in_flight) best = u.get();
        }
        if (!best) {
            why = any_up ? Unavailable::full : Unavailable::down;
            return std::nullopt;
        }
        ++best->in_flight;
        why = Unavailable::none;
        return PoolLease{p.cfg.name,        best->cfg.url,    best->cfg.model, best->key,
                         best->cfg.grammar, p.cfg.timeout_ms, best->id,        best->cfg.cache_salt};
    }
    return std::nullopt;
}

void PoolSet::release(const PoolLease & l, PoolOutcome outcome, double head_s) {
    std::lock_guard lk(mu_);
    for (auto & p : pools_) {
        if (p.cfg.name != l.pool) continue;
        for (auto & u : p.ups) {
            if (u->id != l.id) continue;
            --u->in_flight;
            switch (outcome) {
                case PoolOutcome::ok:
                    ++u->ok;
                    u->fails = 0;
                    metrics_
                        .histogram(prefix_ + "upstream_seconds",
                                   "Time an upstream of a pool took to answer (the head of a stream)",
                                   obs::latency_buckets(), {{"pool", p.cfg.name}})
                        .observe(head_s);
                    break;
                case PoolOutcome::busy:
                    ++u->busy;
                    break;
                case PoolOutcome::cancelled:
                    break;
                case PoolOutcome::failed:
                    ++u->failed;
                    if (++u->fails >= p.cfg.breaker_errors && u->state == Upstream::State::up) {
                        u->state = Upstream::State::open;
                        u->open_until_ms = common::steady_ms() + p.cfg.breaker_open_ms;
                        u->next_check_ms = u->open_until_ms;
                        ++u->opened;
                        spdlog::warn("gateway: pool {}: {} failed {} times in a row; its breaker opens for {} ms",
                                     p.cfg.name, u->cfg.url, u->fails, p.cfg.breaker_open_ms);
                    }
                    break;
            }
            return;
        }
    }
}

bool PoolSet::has(const std::string & pool) const {
    std::lock_guard lk(mu_);
    return std::any_of(pools_.begin(), pools_.end(), [&](const Pool & p) { return p.cfg.name == pool; });
}

int64_t PoolSet::context(const std::string & pool) const {
    std::lock_guard lk(mu_);
    for (const auto & p : pools_) {
        if (p.cfg.name == pool) return p.cfg.context;
    }
    return 0;
}

std::vector<std::string> PoolSet::names() const {
    std::lock_guard lk(mu_);
    std::vector<std::string> out;
    for (const auto & p : pools_)
        out.push_back(p.cfg.name);
    return out;
}

nlohmann::json PoolSet::status(bool detail) const {
    std::lock_guard lk(mu_);
    nlohmann::json out = nlohmann::json::object();
    for (const auto & p : pools_) {
        nlohmann::json ups = nlohmann::json::array();
        int up = 0;
        for (const auto & u : p.ups) {
            ups.push_back({{"url", u->cfg.url},
                           {"state", u->removed ? "draining" : state_name(u->state)},
                           {"in_flight", u->in_flight},
                           {"breaker_opened", u->opened}});
            if (!u->removed && u->state == Upstream::State::up) ++up;
        }
        out[p.cfg.name] = {{"up", up}, {"upstreams", detail ? ups : nlohmann::json(p.ups.size())}};
    }
    return out;
}

uint64_t PoolSet::breaker_opened(const std::string & pool) const {
    std::lock_guard lk(mu_);
    uint64_t n = 0;
    for (const auto & p : pools_) {
        if (p.cfg.name != pool) continue;
        for (const auto & u : p.ups)
            n += u->opened;
    }
    return n;
}

std::string PoolSet::render_metrics() const {
    obs::Registry m;
    {
        std::lock_guard lk(mu_);
        for (const auto & p : pools_) {
            for (const auto & u : p.ups) {
                const obs::Labels l{{"pool", p.cfg.name}, {"upstream", u->cfg.url}};
                m.gauge(prefix_ + "upstream_up",
                        "1 while an upstream of a pool takes requests (healthy, warmed, breaker closed)", l)
                    .set(!u->removed && u->state == Upstream::State::up ? 1 : 0);
                m.gauge(prefix_ + "upstream_breaker_open", "1 while an upstream's circuit breaker is open", l)
                    .set(u->state == Upstream::State::open ? 1 : 0);
                m.gauge(prefix_ + "upstream_in_flight", "Requests an upstream of a pool has in flight", l)
                    .set(u->in_flight);
                m.sync_counter(prefix_ + "upstream_breaker_opened_total", "Times an upstream's circuit breaker opened",
                               u->opened, l);
                for (const auto & [outcome, n] :
                     {std::pair<const char *, uint64_t>{"ok", u->ok}, {"failed", u->failed}, {"busy", u->busy}}) {
                    obs::Labels lo = l;
                    lo.emplace_back("outcome", outcome);
                    m.sync_counter(prefix_ + "upstream_requests_total",
                                   "Requests sent to an upstream of a pool, by how they ended", n, lo);
                }
            }
        }
    }
    return m.render() + metrics_.render();
}

}  // namespace armada::routing

#include "cluster/membership.h"

#include "cluster/runtime/election.h"
#include "common/clock.h"
#include "common/json_fields.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string_view>

namespace armada::cluster {

using json = nlohmann::json;

namespace {

// A node writes its report every second and brains read thousands of them: the report is
// written straight to text, in the bytes nlohmann::json's dump gives (keys in order, numbers
// and strings as it writes them), without building a document first.
void put_string(std::string & out, const std::string & s) {
    // Printable ASCII without quotes or backslashes is dumped as it is; anything else takes
    // nlohmann::json's escaping, and its refusal of text that is not UTF-8.
    if (std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; })) {
        out += '"';
        out += s;
        out += '"';
        return;
    }
    out += json(s).dump();
}

void put_key(std::string & out, const char * k, bool & first) {
    out += first ? "{\"" : ",\"";
    first = false;
    out += k;
    out += "\":";
}

template <class V>
void put_map(std::string & out, const std::map<std::string, V> & m) {
    out += '{';
    bool first = true;
    for (const auto & [k, v] : m) {
        if (!first) out += ',';
        first = false;
        put_string(out, k);
        out += ':';
        out += std::to_string(v);
    }
    out += '}';
}

void put_signals(std::string & out, const NodeSignals & s) {
    bool f = true;
    put_key(out, "completed", f);
    out += std::to_string(s.completed);
    put_key(out, "errors", f);
    put_map(out, s.errors);
    put_key(out, "failed", f);
    out += std::to_string(s.failed);
    put_key(out, "lease_lost", f);
    out += std::to_string(s.lease_lost);
    put_key(out, "renew_failed", f);
    out += std::to_string(s.renew_failed);
    put_key(out, "renew_late", f);
    out += std::to_string(s.renew_late);
    put_key(out, "started_ms", f);
    out += std::to_string(s.started_ms);
    put_key(out, "step_s", f);
    out += json(s.step_s).dump();
    put_key(out, "steps", f);
    out += std::to_string(s.steps);
    out += '}';
}

}  // namespace

std::string encode_load(const NodeLoad & l) {
    std::string out;
    out.reserve(512);
    bool f = true;
    put_key(out, "by_state", f);
    put_map(out, l.by_state);
    put_key(out, "cores", f);
    out += std::to_string(l.cores);
    put_key(out, "ctx", f);
    out += std::to_string(l.ctx);
    put_key(out, "draining", f);
    out += l.draining ? "true" : "false";
    put_key(out, "engines", f);
    out += std::to_string(l.engines);
    put_key(out, "fingerprint", f);
    put_string(out, l.fingerprint);
    put_key(out, "free_seqs", f);
    out += std::to_string(l.free_seqs);
    put_key(out, "kv_budget", f);
    out += std::to_string(l.kv_budget);
    put_key(out, "kv_by_tenant", f);
    put_map(out, l.kv_by_tenant);
    put_key(out, "kv_headroom", f);
    out += std::to_string(l.kv_headroom);
    put_key(out, "seq", f);
    out += std::to_string(l.seq);
    put_key(out, "sessions", f);
    out += std::to_string(l.sessions);
    put_key(out, "signals", f);
    put_signals(out, l.signals);
    put_key(out, "step_ms", f);
    out += json(l.step_ms).dump();
    put_key(out, "url", f);
    put_string(out, l.url);
    put_key(out, "version", f);
    put_string(out, l.version);
    out += '}';
    return out;
}

namespace {

//! A reader of `encode_load`'s exact form. Every method returns false on anything else, and the
//! caller then gives the text to the JSON parser: taking less is always safe, taking more is not.
class Canonical {
  public:
    explicit Canonical(const std::string & s) : p_(s.data()), e_(s.data() + s.size()) {}
    bool done() const { return p_ == e_; }
    bool lit(std::string_view s) {
        if (size_t(e_ - p_) < s.size() || std::memcmp(p_, s.data(), s.size()) != 0) return false;
        p_ += s.size();
        return true;
    }
    //! `"name":` after `{` (the first) or `,`.
    bool key(const char * name, bool first) { return lit(first ? "{\"" : ",\"") && lit(name) && lit("\":"); }
    //! A JSON integer without a sign on zero and without leading zeros, within [lo, hi].
    bool integer(int64_t & out, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
        const char * q = p_;
        const bool neg = q < e_ && *q == '-';
        if (neg) ++q;
        if (q == e_ || *q < '0' || *q > '9' || (*q == '0' && (neg || (q + 1 < e_ && q[1] >= '0' && q[1] <= '9'))))
            return false;
        const char * digits = q;
        while (q < e_ && *q >= '0' && *q <= '9')
            ++q;
        if (q < e_ && (*q == '.' || *q == 'e' || *q == 'E')) return false;  // a float: not here
        int64_t v = 0;
        const auto r = std::from_chars(neg ? digits - 1 : digits, q, v);
        if (r.ec != std::errc() || r.ptr != q || v < lo || v > hi) return false;
        out = v;
        p_ = q;
        return true;
    }
    bool integer(int & out) {
        int64_t v = 0;
        if (!integer(v, INT32_MIN, INT32_MAX)) return false;
        out = int(v);
        return true;
    }
    //! A JSON number in its grammar, read as a double (as the parser's strtod reads it).
    bool number(double & out) {
        const char * q = p_;
        const bool neg = q < e_ && *q == '-';
        if (neg) ++q;
        if (q == e_ || *q < '0' || *q > '9') return false;
        if (*q == '0') {
            ++q;
            // "-0" alone is the integer 0 to the parser (+0.0 once read as a double), not -0.0.
            if (neg && (q == e_ || (*q != '.' && *q != 'e' && *q != 'E'))) return false;
        } else {
            while (q < e_ && *q >= '0' && *q <= '9')
                ++q;
        }
        if (q < e_ && *q == '.') {
            const char * d = ++q;
            while (q < e_ && *q >= '0' && *q <= '9')
                ++q;
            if (q == d) return false;
        }
        if (q < e_ && (*q == 'e' || *q == 'E')) {
            ++q;
            if (q < e_ && (*q == '+' || *q == '-')) ++q;
            const char * d = q;
            while (q < e_ && *q >= '0' && *q <= '9')
                ++q;
            if (q == d) return false;
        }
        double v = 0;
        const auto r = std::from_chars(p_, q, v);
        if (r.ec != std::errc() || r.ptr != q || !std::isfinite(v)) return false;
        out = v;
        p_ = q;
        return true;
    }
    //! A string of printable ASCII without escapes.
    bool str(std::string & out) {
        if (p_ == e_ || *p_ != '"') return false;
        const char * q = p_ + 1;
        while (q < e_ && *q != '"') {
            const auto c = static_cast<unsigned char>(*q);
            if (c < 0x20 || c >= 0x80 || c == '\\') return false;
            ++q;
        }
        if (q == e_) return false;
        out.assign(p_ + 1, q);
        p_ = q + 1;
        return true;
    }
    bool boolean(bool & out) {
        if (lit("true")) {
            out = true;
        } else if (lit("false")) {
            out = false;
        } else {
            return false;
        }
        return true;
    }
    //! `{"k":n,...}` with keys in strictly increasing order (a std::map's, as written).
    template <class V>
    bool map(std::map<std::string, V> & out) {
        out.clear();
        if (!lit("{")) return false;
        if (lit("}")) return true;
        for (;;) {
            std::string k;
            V v{};
            if (!str(k) || !lit(":") || !integer(v)) return false;
            if (!out.empty() && !(out.rbegin()->first < k)) return false;
            out.emplace_hint(out.end(), std::move(k), v);
            if (lit("}")) return true;
            if (!lit(",")) return false;
        }
    }

  private:
    const char * p_;
    const char * e_;
};

}  // namespace

std::optional<NodeLoad> decode_load_canonical(const std::string & node, const std::string & text) {
    Canonical c(text);
    NodeLoad l;
    l.node = node;
    NodeSignals & s = l.signals;
    const bool ok =
        c.key("by_state", true) && c.map(l.by_state) && c.key("cores", false) && c.integer(l.cores) &&
        c.key("ctx", false) && c.integer(l.ctx) && c.key("draining", false) && c.boolean(l.draining) &&
        c.key("engines", false) && c.integer(l.engines) && c.key("fingerprint", false) && c.str(l.fingerprint) &&
        c.key("free_seqs", false) && c.integer(l.free_seqs) && c.key("kv_budget", false) && c.integer(l.kv_budget) &&
        c.key("kv_by_tenant", false) && c.map(l.kv_by_tenant) && c.key("kv_headroom", false) &&
        c.integer(l.kv_headroom) && c.key("seq", false) && c.integer(l.seq) && c.key("sessions", false) &&
        c.integer(l.sessions) && c.key("signals", false) &&
        // the signals object, in put_signals's order
        c.key("completed", true) && c.integer(s.completed) && c.key("errors", false) && c.map(s.errors) &&
        c.key("failed", false) && c.integer(s.failed) && c.key("lease_lost", false) && c.integer(s.lease_lost) &&
        c.key("renew_failed", false) && c.integer(s.renew_failed) && c.key("renew_late", false) &&
        c.integer(s.renew_late) && c.key("started_ms", false) && c.integer(s.started_ms) && c.key("step_s", false) &&
        c.number(s.step_s) && c.key("steps", false) && c.integer(s.steps) && c.lit("}") &&
        // the rest of the report
        c.key("step_ms", false) && c.number(l.step_ms) && c.key("url", false) && c.str(l.url) &&
        c.key("version", false) && c.str(l.version) && c.lit("}") && c.done();
    if (!ok) return std::nullopt;
    return l;
}

std::optional<NodeLoad> decode_load(const std::string & node, const std::string & text) {
    if (auto l = decode_load_canonical(node, text)) return l;
    return decode_load_json(node, text);
}

std::optional<NodeLoad> decode_load_json(const std::string & node, const std::string & text) {
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    NodeLoad l;
    l.node = node;
    try {
        l.free_seqs = j.value("free_seqs", 0);
        l.kv_headroom = j.value("kv_headroom", int64_t(0));
        l.kv_budget = j.value("kv_budget", int64_t(0));
        l.sessions = j.value("sessions", 0);
        l.version = j.value("version", "");
        l.fingerprint = j.value("fingerprint", "");
        l.draining = j.value("draining", false);
        l.url = j.value("url", "");
        l.engines = j.value("engines", 0);
        l.cores = j.value("cores", 0);
        l.step_ms = j.value("step_ms", 0.0);
        l.ctx = j.value("ctx", int64_t(0));
        l.seq = j.value("seq", int64_t(0));
        if (const auto * m = common::object_field(j, "by_state")) l.by_state = m->get<std::map<std::string, int>>();
        if (auto s = j.find("signals"); s != j.end() && s->is_object()) {
            // Signals of the wrong shape are no signals, not a report to refuse.
            try {
                l.signals = s->get<NodeSignals>();
            } catch (const json::exception &) {
                l.signals = {};
            }
        }
        if (const auto * m = common::object_field(j, "kv_by_tenant"))
            l.kv_by_tenant = m->get<std::map<std::string, int64_t>>();
    } catch (const json::exception &) {
        return std::nullopt;  // a field of the wrong type: not a report to trust
    }
    return l;
}

NodeLoad NodeMembership::numbered() {
    if (seq_ == 0) seq_ = int64_t(std::random_device{}() & 0x3fffffff) << 20;
    NodeLoad l = load_();
    l.seq = ++seq_;
    l.signals.renew_late = renew_late_.load();
    l.signals.renew_failed = renew_failed_.load();
    l.signals.lease_lost = lease_lost_.load();
    return l;
}

std::string encode_cell_report(const CellReport & r) {
    json j{{"nodes", r.nodes},
           {"cores", r.cores},
           {"capacity", r.capacity},
           {"free_seqs", r.free_seqs},
           {"kv_headroom", r.kv_headroom},
           {"kv_budget", r.kv_budget},
           {"live_sessions", r.live_sessions},
           {"queued", r.queued},
           {"step_ms", r.step_ms},
           {"by_tenant", r.by_tenant}};
    if (!r.ended.empty()) j["ended"] = r.ended;
    if (!r.leader.empty()) j["leader"] = r.leader;
    if (!r.failovers.empty()) {
        json f = json::array();
        for (const auto & x : r.failovers)
            f.push_back({{"at_ms", x.at_ms}, {"node", x.node}, {"sessions", x.sessions}});
        j["failovers"] = std::move(f);
    }
    return j.dump();
}

std::optional<CellReport> decode_cell_report(const std::string & cell, const std::string & text) {
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    CellReport r;
    r.cell = cell;
    try {
        r.nodes = j.value("nodes", 0);
        r.cores = j.value("cores", 0);
        r.capacity = j.value("capacity", 0);
        r.free_seqs = j.value("free_seqs", 0);
        r.kv_headroom = j.value("kv_headroom", int64_t(0));
        r.kv_budget = j.value("kv_budget", int64_t(0));
        r.live_sessions = j.value("live_sessions", 0);
        r.queued = j.value("queued", 0);
        r.step_ms = j.value("step_ms", 0.0);
        r.leader = j.value("leader", "");
        if (const auto * m = common::object_field(j, "by_tenant")) r.by_tenant = m->get<std::map<std::string, int>>();
        if (const auto * m = common::object_field(j, "ended")) r.ended = m->get<std::map<std::string, int64_t>>();
        if (const auto * fs = common::array_field(j, "failovers")) {
            for (const auto & f : *fs) {
                if (r.failovers.size() >= CellReport::kMaxFailovers) break;
                if (!f.is_object()) continue;
                r.failovers.push_back(
                    {f.value("at_ms", int64_t(0)), f.value("node", std::string()), f.value("sessions", 0)});
            }
        }
    } catch (const json::exception &) {
        return std::nullopt;
    }
    if (r.capacity < 0 || r.live_sessions < 0 || r.queued < 0 || !std::isfinite(r.step_ms)) return std::nullopt;
    // Counts, summed by the dashboard: none negative, none near overflowing.
    constexpr int64_t kMaxCount = int64_t(1) << 48;
    for (const auto & [outcome, n] : r.ended) {
        if (n < 0 || n > kMaxCount) return std::nullopt;
    }
    for (const auto & f : r.failovers) {
        if (f.sessions < 0) return std::nullopt;
    }
    return r;
}

std::string encode_shares(const Shares & s) {
    return json{{"weight", s.weight}, {"tenant_home", s.tenant_home}, {"full", s.full}}.dump();
}

std::optional<Shares> decode_shares(const std::string & text) {
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    Shares s;
    try {
        if (j.contains("weight")) s.weight = j["weight"].get<std::map<std::string, double>>();
        if (j.contains("tenant_home")) s.tenant_home = j["tenant_home"].get<std::map<std::string, std::string>>();
        if (j.contains("full")) s.full = j["full"].get<std::set<std::string>>();
    } catch (const json::exception &) {
        return std::nullopt;
    }
    for (const auto & [cell, w] : s.weight)
        if (!std::isfinite(w) || w < 0) return std::nullopt;
    return s;
}

NodeMembership::NodeMembership(std::shared_ptr<KvStore> kv, std::string key, int ttl_s, int report_ms,
                               std::function<NodeLoad()> load)
    : kv_(std::move(kv)), key_(std::move(key)), ttl_s_(ttl_s), report_ms_(report_ms), load_(std::move(load)) {}

NodeMembership::NodeMembership(EtcdClient etcd, std::string key, int ttl_s, int report_ms,
                               std::function<NodeLoad()> load)
    : NodeMembership(std::make_shared<EtcdKvStore>(std::move(etcd)), std::move(key), ttl_s, report_ms,
                     std::move(load)) {}

NodeMembership::~NodeMembership() {
    stop();
}

void NodeMembership::start() {
    thread_ = std::thread([this] { run(); });
    renew_thread_ = std::thread([this] { renew(); });
}

void NodeMembership::stop() {
    {
        std::lock_guard lk(mu_);
        if (stop_) return;
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (renew_thread_.joinable()) renew_thread_.join();
    *current_until_ms_ = 0;
    if (const int64_t l = lease_.exchange(0); l != 0) kv_->lease_revoke(l);
}

bool NodeMembership::pause(int ms, bool until_lost) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, std::chrono::milliseconds(ms), [&] { return stop_ || (until_lost && lease_.load() == 0); });
    return !stop_;
}

bool lease_current(const std::atomic<int64_t> & until_ms) {
    return common::steady_ms() < until_ms.load();
}

int NodeMembership::renew_period_ms() const {
    return int(std::min<int64_t>(report_ms_, renew_every_ms(int64_t(ttl_s_) * 1000)));
}

void NodeMembership::run() {
    std::mt19937 rng(std::random_device{}());
    // A random pause of 0.5..1.5 times `ms`, for every retry and re-registration.
    auto jitter = [&](int ms) { return std::uniform_int_distribution<int>(ms / 2, ms + ms / 2)(rng); };
    int backoff = 500;
    int64_t had = 0;  // the lease it registered last
    for (;;) {
        if (lease_.load() == 0) {
            // It was lost: nodes that lost theirs together (an etcd restored) do not join in step.
            if (had != 0 && !pause(jitter(1000))) return;
            had = 0;
            int64_t lease = 0;
            const int64_t sent_ms = common::steady_ms();
            std::string e = kv_->lease_grant(int64_t(ttl_s_) * 1000, lease);
            if (e.empty()) e = kv_->put(key_, encode_load(numbered()), lease);
            if (!e.empty()) {
                spdlog::warn("cluster: cannot register {} in etcd: {}; retrying", key_, e);
                if (!pause(jitter(backoff))) return;
                backoff = std::min(backoff * 2, 8000);
                continue;
            }
            backoff = 500;
            *current_until_ms_ = sent_ms + int64_t(ttl_s_) * 1000;
            lease_ = had = lease;
            const int n = ++registrations_;
            spdlog::info("cluster: {} {} (lease {:x}, ttl {} s)", n == 1 ? "joined as" : "joined again as", key_, lease,
                         ttl_s_);
        }
        if (!pause(report_ms_, true)) return;  // woken early when the lease is found gone
        const int64_t l = lease_.load();
        if (l == 0) continue;
        // Slow or failing reports leave the lease alone: the renewals go on beside them.
        if (auto e = kv_->put(key_, encode_load(numbered()), l); !e.empty())
            spdlog::warn("cluster: load report for {} failed: {}", key_, e);
    }
}

void NodeMembership::renew() {
    const int period = renew_period_ms();
    int64_t held = 0, last_renewal = 0;
    while (pause(period)) {
        const int64_t l = lease_.load();
        if (l == 0) continue;
        if (l != held) {  // joined just now
            held = l;
            last_renewal = common::steady_ms();
        }
        bool alive = false;
        const int64_t sent_ms = common::steady_ms();
        // Heartbeat anomalies, for rollouts' gates: a renewal that failed, one late by over twice
        // its period (the process or its host stalled), a lease found gone.
        if (const std::string e = kv_->lease_keepalive(l, alive); !e.empty()) {
            renew_failed_++;
            spdlog::debug("cluster: renewing the lease of {}: {}", key_, e);
            continue;
        }
        if (alive) {
            const int64_t now = common::steady_ms();
            *current_until_ms_ = sent_ms + int64_t(ttl_s_) * 1000;
            if (now - last_renewal > 2 * period + 500) renew_late_++;
            last_renewal = now;
            continue;
        }
        lease_lost_++;
        spdlog::warn("cluster: lease of {} expired (the node was away longer than {} s); joining again", key_, ttl_s_);
        {
            std::lock_guard lk(mu_);
            int64_t expect = l;
            if (lease_.compare_exchange_strong(expect, 0)) *current_until_ms_ = 0;
        }
        cv_.notify_all();  // the reporter joins again
    }
}

std::string member_url(EtcdClient & etcd, const std::string & node_key, const std::string & node, std::string & why) {
    std::optional<EtcdKv> kv;
    if (auto e = etcd.get(node_key, kv); !e.empty()) {
        why = "etcd: " + e;
        return {};
    }
    if (!kv) {
        why = "node " + node + " is not in its cell (no key in etcd)";
        return {};
    }
    if (kv->lease == 0) {
        why = "node " + node + "'s key holds no lease: no member wrote it";
        return {};
    }
    int64_t ttl = -1;
    if (auto e = etcd.lease_ttl(kv->lease, ttl); !e.empty()) {
        why = "etcd: " + e;
        return {};
    }
    if (ttl <= 0) {
        why = "node " + node + "'s lease has expired";
        return {};
    }
    auto l = decode_load(node, kv->value);
    if (!l || l->url.empty()) {
        why = "node " + node + "'s key names no URL";
        return {};
    }
    return l->url;
}

}  // namespace armada::cluster

#include "cluster/etcd.h"

#include "common/json_fields.h"
#include "net/http_client.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>

namespace armada::cluster {

using json = nlohmann::json;

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

//! The gateway writes int64 as strings ("12"); accept numbers too.
int64_t i64(const json & j, const char * k) {
    if (!j.is_object()) return 0;
    auto it = j.find(k);
    if (it == j.end()) return 0;
    if (it->is_number_integer()) return it->get<int64_t>();
    if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
    return 0;
}

//! A string field, or "" when absent or of another type (nothing from the wire may throw).
std::string str(const json & j, const char * k) {
    return common::string_field(j, k).value_or("");
}

EtcdKv kv_of(const json & j) {
    EtcdKv kv;
    if (!j.is_object()) return kv;
    kv.key = EtcdClient::unbase64(str(j, "key")).value_or("");
    kv.value = EtcdClient::unbase64(str(j, "value")).value_or("");
    kv.create_revision = i64(j, "create_revision");
    kv.mod_revision = i64(j, "mod_revision");
    kv.lease = i64(j, "lease");
    return kv;
}

bool split_endpoint(const std::string & ep, std::string & host, std::string & port) {
    std::string e = ep;
    if (e.rfind("http://", 0) == 0) e = e.substr(7);
    if (e.rfind("https://", 0) == 0) e = e.substr(8);
    while (!e.empty() && e.back() == '/')
        e.pop_back();
    const auto colon = e.rfind(':');
    if (colon == std::string::npos) return false;
    host = e.substr(0, colon);
    port = e.substr(colon + 1);
    return !host.empty() && !port.empty();
}

//! The URL of `path` at an endpoint: https:// whenever the client has TLS.
std::string url_of(const std::string & host, const std::string & port, const std::string & path, bool tls) {
    return std::string(tls ? "https://" : "http://") + host + ":" + port + path;
}

armada::net::HeaderList headers(const std::string & token) {
    armada::net::HeaderList h{{"Content-Type", "application/json"}};
    if (!token.empty()) h.emplace_back("Authorization", token);
    return h;
}

//! The message of an error reply ({"error": "...", "code": N, "message": "..."}).
std::string error_text(const std::string & body) {
    auto j = json::parse(body, nullptr, false);
    if (j.is_object()) {
        if (auto m = common::string_field(j, "message")) return *m;
        if (auto e = common::string_field(j, "error")) return *e;
        if (const auto * e = common::object_field(j, "error")) {
            const std::string m = str(*e, "message");
            return m.empty() ? body.substr(0, 300) : m;
        }
    }
    return body.substr(0, 300);
}

}  // namespace

std::string EtcdClient::base64(const std::string & s) {
    std::string out;
    out.reserve((s.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 2 < s.size(); i += 3) {
        const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
        out += kB64[v >> 18];
        out += kB64[(v >> 12) & 63];
        out += kB64[(v >> 6) & 63];
        out += kB64[v & 63];
    }
    if (i + 1 == s.size()) {
        const uint32_t v = uint8_t(s[i]) << 16;
        out += kB64[v >> 18];
        out += kB64[(v >> 12) & 63];
        out += "==";
    } else if (i + 2 == s.size()) {
        const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
        out += kB64[v >> 18];
        out += kB64[(v >> 12) & 63];
        out += kB64[(v >> 6) & 63];
        out += '=';
    }
    return out;
}

std::optional<std::string> EtcdClient::unbase64(const std::string & s) {
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    size_t pad = 0;
    for (char c : s) {
        if (c == '=') {
            ++pad;
            continue;
        }
        if (pad) return std::nullopt;  // data after padding
        const char * p = std::strchr(kB64, c);
        if (!p || !c) return std::nullopt;
        acc = (acc << 6) | uint32_t(p - kB64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out += char((acc >> bits) & 0xff);
        }
    }
    if (pad > 2) return std::nullopt;
    return out;
}

std::string EtcdClient::prefix_end(const std::string & prefix) {
    std::string end = prefix;
    while (!end.empty()) {
        if (uint8_t(end.back()) < 0xff) {
            end.back() = char(uint8_t(end.back()) + 1);
            return end;
        }
        end.pop_back();
    }
    return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, int timeout_ms)
    : endpoints_(std::move(endpoints)), timeout_ms_(timeout_ms) {}

void EtcdClient::set_tls(std::shared_ptr<boost::asio::ssl::context> tls, std::string error) {
    tls_ = std::move(tls);
    tls_error_ = tls_ ? std::string() : std::move(error);
}

void EtcdClient::set_credentials(const std::string & user, const std::string & password) {
    if (user.empty()) {
        auth_.reset();
        return;
    }
    auth_ = std::make_shared<Auth>();
    auth_->user = user;
    auth_->password = password;
}

std::string EtcdClient::token(std::string & error, bool renew) {
    if (!auth_) return {};
    std::lock_guard lk(auth_->mu);
    if (!renew && !auth_->token.empty()) return auth_->token;
    std::string r;
    const std::string body = json{{"name", auth_->user}, {"password", auth_->password}}.dump();
    if (auto e = call_raw("/v3/auth/authenticate", body, r, timeout_ms_, nullptr, ""); !e.empty()) {
        // Never the password: etcd's words name the user at most.
        error = "etcd refused user '" + auth_->user + "': " + e;
        return {};
    }
    const json j = json::parse(r, nullptr, false);
    const std::string token = str(j, "token");
    if (token.empty()) {
        error = "etcd gave user '" + auth_->user + "' no token";
        return {};
    }
    auth_->token = token;
    return auth_->token;
}

std::string EtcdClient::call(const std::string & path, const std::string & body, std::string & reply, int timeout_ms,
                             const std::atomic<bool> * stop) {
    if (!auth_) return call_raw(path, body, reply, timeout_ms, stop, "");
    for (int attempt = 0;; ++attempt) {
        std::string err;
        const std::string tok = token(err, attempt > 0);
        if (tok.empty()) return err;
        std::string e = call_raw(path, body, reply, timeout_ms, stop, tok);
        // A token etcd no longer knows (it expired, or etcd restarted): one more, once.
        if (attempt == 0 && (e.find("invalid auth token") != std::string::npos || e.rfind("etcd 401", 0) == 0))
            continue;
        return e;
    }
}

std::string EtcdClient::call_raw(const std::string & path, const std::string & body, std::string & reply,
                                 int timeout_ms, const std::atomic<bool> * stop, const std::string & token) {
    if (!tls_error_.empty()) return tls_error_;
    std::string last = "no etcd endpoint given";
    for (const auto & ep : endpoints_) {
        std::string host, port;
        if (!split_endpoint(ep, host, port)) {
            last = "bad etcd endpoint '" + ep + "' (want host:port)";
            continue;
        }
        if (!tls_ && ep.rfind("https://", 0) == 0) {
            // Never a token or a password in the clear to an endpoint that asked for TLS.
            last = "etcd at " + ep + ": an https:// endpoint, and this client has no TLS";
            continue;
        }
        armada::net::HttpOptions o;
        o.timeout_ms = timeout_ms;
        o.max_body = 64 << 20;
        o.tls = tls_.get();
        o.ca_setting = "credentials.etcd.ca_file";
        o.stop = stop;
        const auto r =
            armada::net::http_call({"POST", url_of(host, port, path, tls_ != nullptr), headers(token), body}, o);
        if (r.failure == armada::net::HttpFailure::cancelled) return "etcd at " + ep + ": no answer in time";
        if (!r.error.empty()) {
            last = "etcd at " + ep + ": " +
                   (r.failure == armada::net::HttpFailure::timeout ? std::string("no answer in time") : r.error);
            continue;
        }
        if (r.status != 200) {
            // The server answered: another endpoint would say the same.
            return "etcd " + std::to_string(r.status) + ": " + error_text(r.body);
        }
        reply = r.body;
        return {};
    }
    return last;
}

std::string EtcdClient::grant(int ttl_s, int64_t & lease) {
    std::string r;
    if (auto e = call("/v3/lease/grant", json{{"TTL", ttl_s}}.dump(), r, timeout_ms_); !e.empty()) return e;
    auto j = json::parse(r, nullptr, false);
    lease = j.is_object() ? i64(j, "ID") : 0;
    if (lease == 0) return "etcd granted no lease: " + r.substr(0, 200);
    return {};
}

std::string EtcdClient::keepalive(int64_t lease, int64_t & ttl) {
    return keepalive(lease, ttl, timeout_ms_);
}

std::string EtcdClient::keepalive(int64_t lease, int64_t & ttl, int timeout_ms) {
    std::string r;
    if (auto e = call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump(), r, timeout_ms); !e.empty())
        return e;
    // A stream of one message: {"result": {"ID": …, "TTL": …}}; a lease that is gone has no TTL.
    auto j = json::parse(r.substr(0, r.find('\n')), nullptr, false);
    if (!j.is_object()) return "etcd keepalive: unreadable reply";
    const json & res = j.contains("result") ? j["result"] : j;
    if (j.contains("error")) return "etcd keepalive: " + error_text(r);
    ttl = i64(res, "TTL");
    return {};
}

std::string EtcdClient::revoke(int64_t lease) {
    std::string r;
    return call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump(), r, timeout_ms_);
}

std::string EtcdClient::lease_ttl(int64_t lease, int64_t & ttl) {
    std::string r;
    ttl = -1;
    if (auto e = call("/v3/lease/timetolive", json{{"ID", std::to_string(lease)}}.dump(), r, timeout_ms_); !e.empty())
        return e;
    const json j = json::parse(r, nullptr, false);
    if (!j.is_object()) return "etcd: unreadable lease reply";
    // The gateway prints 64-bit numbers as strings.
    if (auto it = j.find("TTL"); it != j.end()) {
        if (it->is_string())
            ttl = std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
        else if (it->is_number_integer())
            ttl = it->get<int64_t>();
    }
    return {};
}

std::string EtcdClient::put(const std::string & key, const std::string & value, int64_t lease) {
    json b{{"key", base64(key)}, {"value", base64(value)}};
    if (lease) b["lease"] = std::to_string(lease);
    std::string r;
    return call("/v3/kv/put", b.dump(), r, timeout_ms_);
}

std::string EtcdClient::get(const std::string & key, std::optional<EtcdKv> & out) {
    std::string r;
    if (auto e = call("/v3/kv/range", json{{"key", base64(key)}}.dump(), r, timeout_ms_); !e.empty()) return e;
    auto j = json::parse(r, nullptr, false);
    out.reset();
    if (const auto * kvs = common::array_field(j, "kvs"); kvs && !kvs->empty()) out = kv_of((*kvs)[0]);
    return {};
}

std::string EtcdClient::status(EtcdStatus & out, bool & alarms_known) {
    std::string r;
    if (auto e = call("/v3/maintenance/status", "{}", r, timeout_ms_); !e.empty()) return e;
    auto j = json::parse(r, nullptr, false);
    if (!j.is_object()) return "etcd status: unreadable reply";
    out = {};
    out.db_bytes = i64(j, "dbSize");
    out.db_in_use_bytes = i64(j, "dbSizeInUse");
    out.revision = j.contains("header") ? i64(j["header"], "revision") : 0;
    out.version = common::string_field(j, "version").value_or("");
    alarms_known = false;
    std::string a;
    if (call("/v3/maintenance/alarm", R"({"action":"GET"})", a, timeout_ms_).empty()) {
        auto ja = json::parse(a, nullptr, false);
        if (ja.is_object()) {
            alarms_known = true;
            if (const auto * alarms = common::array_field(ja, "alarms"))
                for (const auto & al : *alarms)
                    if (auto name = common::string_field(al, "alarm")) out.alarms.push_back(std::move(*name));
        }
    }
    return {};
}

std::string EtcdClient::list(const std::string & prefix, std::vector<EtcdKv> & out, int64_t & revision) {
    std::string r;
    const json b{{"key", base64(prefix)}, {"range_end", base64(prefix_end(prefix))}};
    if (auto e = call("/v3/kv/range", b.dump(), r, timeout_ms_); !e.empty()) return e;
    auto j = json::parse(r, nullptr, false);
    if (!j.is_object()) return "etcd range: unreadable reply";
    out.clear();
    if (const auto * kvs = common::array_field(j, "kvs")) {
        for (const auto & kv : *kvs)
            out.push_back(kv_of(kv));
    }
    revision = j.contains("header") ? i64(j["header"], "revision") : 0;
    return {};
}

std::string EtcdClient::erase(const std::string & key) {
    std::string r;
    return call("/v3/kv/deleterange", json{{"key", base64(key)}}.dump(), r, timeout_ms_);
}

std::string EtcdClient::erase_if_created(const std::string & key, int64_t create_revision, bool & erased) {
    const json body{{"compare", json::array({{{"key", base64(key)},
                                              {"result", "EQUAL"},
                                              {"target", "CREATE"},
                                              {"create_revision", std::to_string(create_revision)}}})},
                    {"success", json::array({{{"request_delete_range", {{"key", base64(key)}}}}})}};
    std::string r;
    if (auto e = call("/v3/kv/txn", body.dump(), r, timeout_ms_); !e.empty()) return e;
    const auto j = json::parse(r, nullptr, false);
    if (!j.is_object()) return "etcd txn: unreadable reply";
    erased = common::bool_field(j, "succeeded").value_or(false);
    return {};
}

std::string EtcdClient::txn(const std::vector<EtcdCompare> & compares,
                            const std::vector<std::pair<std::string, std::string>> & puts, bool & succeeded,
                            int64_t & revision) {
    json cmp = json::array();
    for (const auto & c : compares) {
        const bool create = c.target == EtcdCompare::Target::Create;
        cmp.push_back({{"key", base64(c.key)},
                       {"result", "EQUAL"},
                       {"target", create ? "CREATE" : "MOD"},
                       {create ? "create_revision" : "mod_revision", std::to_string(c.revision)}});
    }
    json ops = json::array();
    for (const auto & [k, v] : puts)
        ops.push_back({{"request_put", {{"key", base64(k)}, {"value", base64(v)}}}});
    std::string r;
    const json body{{"compare", cmp}, {"success", ops}};
    if (auto e = call("/v3/kv/txn", body.dump(), r, timeout_ms_); !e.empty()) return e;
    auto j = json::parse(r, nullptr, false);
    if (!j.is_object()) return "etcd txn: unreadable reply";
    // proto3 JSON leaves a false `succeeded` out.
    succeeded = common::bool_field(j, "succeeded").value_or(false);
    revision = j.contains("header") ? i64(j["header"], "revision") : 0;
    return {};
}

std::string EtcdClient::campaign(const std::string & name, const std::string & value, int64_t lease, int wait_ms,
                                 EtcdLeader & out, const std::atomic<bool> * give_up) {
    std::string r;
    const json b{{"name", base64(name)}, {"value", base64(value)}, {"lease", std::to_string(lease)}};
    if (auto e = call("/v3/election/campaign", b.dump(), r, wait_ms, give_up); !e.empty()) {
        if (e.find("no answer in time") != std::string::npos) return "not elected yet";
        return e;
    }
    auto j = json::parse(r, nullptr, false);
    if (!j.is_object() || !j.contains("leader")) return "etcd campaign: unreadable reply";
    const json & l = j["leader"];
    out.name = unbase64(str(l, "name")).value_or("");
    out.key = unbase64(str(l, "key")).value_or("");
    out.rev = i64(l, "rev");
    out.lease = i64(l, "lease");
    out.value = value;
    return {};
}

std::string EtcdClient::leader(const std::string & name, EtcdLeader & out) {
    std::string r;
    if (auto e = call("/v3/election/leader", json{{"name", base64(name)}}.dump(), r, timeout_ms_); !e.empty()) {
        if (e.find("no leader") != std::string::npos) return "no leader";
        return e;
    }
    auto j = json::parse(r, nullptr, false);
    if (!j.is_object() || !j.contains("kv")) return "no leader";
    const EtcdKv kv = kv_of(j["kv"]);
    out.name = name;
    out.key = kv.key;
    out.value = kv.value;
    out.rev = kv.create_revision;
    out.lease = kv.lease;
    return {};
}

std::string EtcdClient::resign(const EtcdLeader & l) {
    const json b{{"leader",
                  {{"name", base64(l.name)},
                   {"key", base64(l.key)},
                   {"rev", std::to_string(l.rev)},
                   {"lease", std::to_string(l.lease)}}}};
    std::string r;
    return call("/v3/election/resign", b.dump(), r, timeout_ms_);
}

bool EtcdClient::parse_watch_message(const std::string & line, std::vector<EtcdEvent> & events, int64_t & revision,
                                     std::string & error) {
    const auto j = json::parse(line, nullptr, false);
    if (!j.is_object()) return true;  // not a message: skipped
    if (j.contains("error")) {
        error = "etcd watch: " + error_text(j.dump());
        return false;
    }
    const json & res = common::object_field(j, "result") ? j["result"] : j;
    auto canceled = res.find("canceled");
    if (canceled != res.end() && canceled->is_boolean() && canceled->get<bool>()) {
        const std::string why = str(res, "cancel_reason");
        error = "etcd watch canceled: " + (why.empty() ? std::string("compacted") : why);
        return false;
    }
    auto evs = res.find("events");
    if (evs != res.end() && evs->is_array()) {
        for (const auto & e : *evs) {
            EtcdEvent ev;
            ev.type = str(e, "type") == "DELETE" ? EtcdEvent::Type::Delete : EtcdEvent::Type::Put;
            if (e.is_object() && e.contains("kv")) ev.kv = kv_of(e["kv"]);
            events.push_back(std::move(ev));
        }
    }
    revision = res.contains("header") ? i64(res["header"], "revision") : 0;
    return true;
}

std::string EtcdClient::watch(const std::string & prefix, int64_t start_revision,
                              const std::function<bool(const std::vector<EtcdEvent> &, int64_t)> & on_events,
                              const std::atomic<bool> & stop) {
    json create{{"key", base64(prefix)}, {"range_end", base64(prefix_end(prefix))}};
    if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
    return stream(
        "/v3/watch", json{{"create_request", create}}.dump(), "watch",
        [&](const std::string & line, std::string & error) {
            std::vector<EtcdEvent> evs;
            int64_t rev = 0;
            if (!parse_watch_message(line, evs, rev, error)) return false;
            return evs.empty() || on_events(evs, rev);
        },
        stop);
}

std::string EtcdClient::observe(const std::string & name, const std::function<bool(const EtcdLeader &)> & on_leader,
                                const std::atomic<bool> & stop) {
    return stream(
        "/v3/election/observe", json{{"name", base64(name)}}.dump(), "observe",
        [&](const std::string & line, std::string & error) {
            const auto j = json::parse(line, nullptr, false);
            if (!j.is_object()) return true;
            if (j.contains("error")) {
                error = "etcd observe: " + error_text(j.dump());
                return false;
            }
            const json & res = common::object_field(j, "result") ? j["result"] : j;
            const auto * kv_json = common::object_field(res, "kv");
            if (!kv_json) return true;
            const EtcdKv kv = kv_of(*kv_json);
            EtcdLeader l;
            l.name = name;
            l.key = kv.key;
            l.value = kv.value;
            l.rev = kv.create_revision;
            l.lease = kv.lease;
            return on_leader(l);
        },
        stop);
}

std::string EtcdClient::stream(const std::string & path, const std::string & body, const char * what,
                               const std::function<bool(const std::string &, std::string &)> & on_line,
                               const std::atomic<bool> & stop) {
    if (!tls_error_.empty()) return tls_error_;
    std::string terr;
    const std::string tok = token(terr, false);
    if (auth_ && tok.empty()) return terr;
    std::string last = "no etcd endpoint given";
    for (const auto & ep : endpoints_) {
        std::string host, port;
        if (!split_endpoint(ep, host, port)) continue;
        if (!tls_ && ep.rfind("https://", 0) == 0) {
            last = "etcd at " + ep + ": an https:// endpoint, and this client has no TLS";
            continue;
        }
        std::string pending;  // bytes of the stream not yet split into messages
        std::string error;
        bool done = false;  // a line's handler ended the stream
        armada::net::HttpOptions o;
        o.timeout_ms = timeout_ms_;  // connecting and sending; the head comes with the first message
        o.head_may_wait = true;
        o.tls = tls_.get();
        o.ca_setting = "credentials.etcd.ca_file";
        o.stop = &stop;
        o.on_head = [&](const armada::net::HttpReply & head) {
            if (head.status == 200) return true;
            error = std::string("etcd ") + what + ": HTTP " + std::to_string(head.status);
            return false;
        };
        // The gateway sends one JSON message per line, in chunks; each is handled as it comes.
        o.on_chunk = [&](std::string_view piece) {
            pending.append(piece);
            size_t nl;
            while (!done && (nl = pending.find('\n')) != std::string::npos) {
                const std::string line = pending.substr(0, nl);
                pending.erase(0, nl + 1);
                if (!on_line(line, error)) done = true;
            }
            return !done;
        };
        const auto r =
            armada::net::http_call({"POST", url_of(host, port, path, tls_ != nullptr), headers(tok), body}, o);
        if (stop.load()) return {};
        if (!r.connected) {
            last = "etcd at " + ep + ": " +
                   (r.failure == armada::net::HttpFailure::timeout ? std::string("no answer in time") : r.error);
            continue;
        }
        if (!done && error.empty())
            error = std::string("etcd ") + what + " stream ended" + (r.error.empty() ? "" : ": " + r.error);
        // A token etcd no longer knows (it restarted, or the token expired): the next stream
        // asks for a new one.
        if (auth_ && (error.find("auth token") != std::string::npos || error.find("HTTP 401") != std::string::npos)) {
            std::lock_guard lk(auth_->mu);
            auth_->token.clear();
        }
        return error;
    }
    return last;
}

}  // namespace armada::cluster

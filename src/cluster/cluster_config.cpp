#include "cluster/cluster_config.h"

#include "cluster/runtime/keys.h"
#include "common/url.h"

#include <sys/stat.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <type_traits>

namespace armada::cluster {

namespace {

std::vector<std::string> list_of(const YAML::Node & n) {
    std::vector<std::string> out;
    if (n.IsScalar()) {
        out.push_back(n.as<std::string>());
    } else if (n.IsSequence()) {
        for (const auto & v : n)
            out.push_back(v.as<std::string>());
    }
    return out;
}

//! `rollout:`: each setting named, of its type, in its range.
bool parse_rollout(const YAML::Node & n, RolloutDefaults & out, std::string & error) {
    if (!n || n.IsNull()) return true;  // absent, or `rollout:` with nothing under it
    if (!n.IsMap()) {
        error = "rollout: must be a map of settings (wave_percent, max_per_cell, settle_s, ...)";
        return false;
    }
    auto num = [&](const YAML::Node & m, const std::string & where, const char * key, double lo, double hi,
                   auto & field) {
        if (!m[key]) return true;
        double v = 0;
        try {
            v = m[key].as<double>();
        } catch (const YAML::Exception &) {
            error = where + key + ": must be a number";
            return false;
        }
        using T = std::decay_t<decltype(field)>;
        if (!(v >= lo && v <= hi) || (std::is_integral_v<T> && v != double(int64_t(v)))) {
            std::ostringstream os;
            os << where << key << ": must be " << (std::is_integral_v<T> ? "a whole number " : "") << "from " << lo
               << " to " << hi;
            error = os.str();
            return false;
        }
        field = T(v);
        return true;
    };
    static const char * known[] = {"wave_percent",    "max_per_cell",   "settle_s", "watch_before_s",
                                   "ready_timeout_s", "restarts_per_s", "gates"};
    for (const auto & kv : n) {
        const std::string k = kv.first.as<std::string>();
        if (std::find(std::begin(known), std::end(known), k) == std::end(known)) {
            error = "rollout: unknown setting '" + k + "'";
            return false;
        }
    }
    const std::string r = "rollout: ";
    if (!num(n, r, "wave_percent", 0.1, 100, out.wave_percent) ||
        !num(n, r, "max_per_cell", 1, 1000, out.max_per_cell) || !num(n, r, "settle_s", 0, 86400, out.settle_s) ||
        !num(n, r, "watch_before_s", 0, 86400, out.watch_before_s) ||
        !num(n, r, "ready_timeout_s", 1, 86400, out.ready_timeout_s) ||
        !num(n, r, "restarts_per_s", 0.01, 1000, out.restarts_per_s))
        return false;
    if (const YAML::Node g = n["gates"]) {
        if (!g.IsMap()) {
            error = "rollout: gates: must be a map of settings (min_sessions, latency_ratio, ...)";
            return false;
        }
        static const char * gates[] = {"min_sessions", "min_steps",   "success_drop",    "latency_ratio",
                                       "error_ratio",  "error_floor", "heartbeat_excess"};
        for (const auto & kv : g) {
            const std::string k = kv.first.as<std::string>();
            if (std::find(std::begin(gates), std::end(gates), k) == std::end(gates)) {
                error = "rollout: gates: unknown setting '" + k + "'";
                return false;
            }
        }
        const std::string w = "rollout: gates: ";
        RolloutGates & x = out.gates;
        if (!num(g, w, "min_sessions", 0, 1e6, x.min_sessions) || !num(g, w, "min_steps", 0, 1e6, x.min_steps) ||
            !num(g, w, "success_drop", 0, 1, x.success_drop) || !num(g, w, "latency_ratio", 1, 1000, x.latency_ratio) ||
            !num(g, w, "error_ratio", 1, 1000, x.error_ratio) || !num(g, w, "error_floor", 0, 1000, x.error_floor) ||
            !num(g, w, "heartbeat_excess", 0, 1e6, x.heartbeat_excess))
            return false;
    }
    return true;
}

bool valid_name(const std::string & s) {
    if (s.empty() || s.size() > 63) return false;
    // A name is a part of NATS subjects: '.' separates their tokens, which may not be empty.
    if (s.front() == '.' || s.back() == '.' || s.find("..") != std::string::npos) return false;
    for (char c : s) {
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
    }
    return true;
}

}  // namespace

namespace {

//! A file a setting names: it must be there, and a secret (`private_file`) must be the owner's
//! alone.
bool check_file(const std::string & path, const std::string & where, bool private_file, std::string & error) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || ::access(path.c_str(), R_OK) != 0) {
        error = where + ": cannot read " + path;
        return false;
    }
    if (private_file && (st.st_mode & 077) != 0) {
        error = where + ": " + path + " may be read by other users; make it mode 0600 (chmod 600)";
        return false;
    }
    return true;
}

//! One server's `credentials:` entry: a user and password file (where the server takes them),
//! and TLS files.
bool parse_service_credentials(const YAML::Node & n, const std::string & where, bool takes_password,
                               ServiceCredentials & out, std::string & error) {
    const std::vector<std::string> known =
        takes_password ? std::vector<std::string>{"user", "password_file", "ca_file", "cert_file", "key_file"}
                       : std::vector<std::string>{"ca_file", "cert_file", "key_file"};
    std::string names;
    for (const auto & k : known)
        names += (names.empty() ? "" : ", ") + k;
    if (!n.IsMap()) {
        error = where + ": must be a map of " + names;
        return false;
    }
    for (const auto & f : n) {
        const std::string fk = f.first.as<std::string>();
        if (std::find(known.begin(), known.end(), fk) == known.end()) {
            error = where + ": unknown setting '" + fk + "' (there are " + names + ")";
            return false;
        }
    }
    auto text = [&](const char * k) { return n[k] ? n[k].as<std::string>() : std::string(); };
    out.user = text("user");
    out.password_file = text("password_file");
    out.ca_file = text("ca_file");
    out.cert_file = text("cert_file");
    out.key_file = text("key_file");
    if (out.cert_file.empty() != out.key_file.empty()) {
        error = where + ": cert_file and key_file go together";
        return false;
    }
    if (!out.ca_file.empty() && !check_file(out.ca_file, where + ".ca_file", false, error)) return false;
    if (!out.cert_file.empty() && (!check_file(out.cert_file, where + ".cert_file", false, error) ||
                                   !check_file(out.key_file, where + ".key_file", true, error)))
        return false;
    // The files must also be what they say (PEM a TLS client can load), found now, not at the
    // first connection.
    if (out.tls() && !service_tls(out, where, error)) return false;
    if (!takes_password) return true;
    if (out.password_file.empty()) {
        if (out.user.empty() && out.tls()) return true;  // TLS alone
        error = where + ".password_file: name the file that holds the password";
        return false;
    }
    if (!check_file(out.password_file, where + ".password_file", true, error)) return false;
    std::ifstream pf(out.password_file);
    std::getline(pf, out.password);
    if (out.password.empty()) {
        error = where + ".password_file: " + out.password_file + " is empty";
        return false;
    }
    return true;
}

}  // namespace

std::optional<ClusterConfig> parse_cluster_config(const std::string & yaml, std::string & error) {
    error.clear();
    ClusterConfig c;
    try {
        const YAML::Node root = YAML::Load(yaml);
        if (!root.IsMap()) {
            error = "the cluster file must be a map of settings";
            return std::nullopt;
        }
        static const char * known[] = {
            "etcd",       "nats",           "redis",           "postgres", "prefix",          "lease_ttl_s",
            "report_ms",  "pg_pool",        "redis_pool",      "cells",    "tokenizer",       "pools",
            "routes",     "tenant_latency", "default_latency", "rollout",  "latency_classes", "tenant_latency_max",
            "credentials"};
        for (const auto & kv : root) {
            const std::string k = kv.first.as<std::string>();
            if (std::find(std::begin(known), std::end(known), k) == std::end(known)) {
                error = "unknown setting '" + k + "'";
                return std::nullopt;
            }
        }
        c.etcd = list_of(root["etcd"]);
        if (root["nats"]) c.nats = root["nats"].as<std::string>();
        if (root["redis"]) c.redis = root["redis"].as<std::string>();
        c.postgres = list_of(root["postgres"]);
        if (root["prefix"]) c.prefix = root["prefix"].as<std::string>();
        if (root["lease_ttl_s"]) c.lease_ttl_s = root["lease_ttl_s"].as<int>();
        if (root["report_ms"]) c.report_ms = root["report_ms"].as<int>();
        if (root["pg_pool"]) c.pg_pool = root["pg_pool"].as<int>();
        if (root["redis_pool"]) c.redis_pool = root["redis_pool"].as<int>();
        if (const auto cells = root["cells"]) {
            if (!cells.IsSequence()) {
                error = "cells: must be a list of {name, domain, water}";
                return std::nullopt;
            }
            for (size_t i = 0; i < cells.size(); ++i) {
                const auto & n = cells[i];
                CellConfig cc;
                if (n.IsScalar()) {
                    cc.name = n.as<std::string>();
                } else if (n.IsMap()) {
                    for (const auto & kv : n) {
                        const std::string k = kv.first.as<std::string>();
                        if (k != "name" && k != "domain" && k != "water") {
                            error = "cells[" + std::to_string(i) + "]: unknown setting '" + k + "'";
                            return std::nullopt;
                        }
                    }
                    if (n["name"]) cc.name = n["name"].as<std::string>();
                    if (n["domain"]) cc.domain = n["domain"].as<std::string>();
                    if (n["water"]) cc.water = n["water"].as<double>();
                }
                if (!valid_name(cc.name)) {
                    error = "cells[" + std::to_string(i) + "]: name must be 1..63 of A-Z a-z 0-9 . _ -";
                    return std::nullopt;
                }
                if (!(cc.water > 0 && cc.water <= 1)) {
                    error = "cells[" + std::to_string(i) + "]: water must be above 0 and at most 1";
                    return std::nullopt;
                }
                for (const auto & o : c.cells) {
                    if (o.name == cc.name) {
                        error = "cells[" + std::to_string(i) + "]: '" + cc.name + "' is listed twice";
                        return std::nullopt;
                    }
                }
                c.cells.push_back(cc);
            }
        }
        if (const auto cr = root["credentials"]) {
            if (!cr.IsMap()) {
                error = "credentials: must be a map of server (redis, nats, etcd, postgres) to its settings";
                return std::nullopt;
            }
            for (const auto & kv : cr) {
                const std::string k = kv.first.as<std::string>();
                ServiceCredentials * out = k == "redis"      ? &c.redis_auth
                                           : k == "nats"     ? &c.nats_auth
                                           : k == "etcd"     ? &c.etcd_auth
                                           : k == "postgres" ? &c.postgres_auth
                                           : k == "nodes"    ? &c.nodes_auth
                                                             : nullptr;
                if (!out) {
                    error = "credentials: unknown server '" + k + "' (there are redis, nats, etcd, postgres and nodes)";
                    return std::nullopt;
                }
                if (!parse_service_credentials(kv.second, "credentials." + k, k != "postgres" && k != "nodes", *out,
                                               error))
                    return std::nullopt;
            }
        }
        if (!routing::parse_routing(root, c.routing, error)) return std::nullopt;
        if (!parse_rollout(root["rollout"], c.rollout, error)) return std::nullopt;
    } catch (const YAML::Exception & e) {
        error = std::string("cluster file: ") + e.what();
        return std::nullopt;
    }
    if (c.etcd.empty())
        error = "etcd: at least one host:port is needed";
    else if (c.postgres.empty())
        error = "postgres: at least one postgres:// URL is needed";
    else if (c.lease_ttl_s < 2 || c.lease_ttl_s > 60)
        error = "lease_ttl_s: must be 2..60 seconds";
    else if (c.report_ms < 100 || c.report_ms > c.lease_ttl_s * 1000 / 2)
        error = "report_ms: must be 100 ms .. half the lease TTL";
    else if (c.pg_pool < 1 || c.pg_pool > 256)
        error = "pg_pool: must be 1..256";
    else if (c.redis_pool < 1 || c.redis_pool > 256)
        error = "redis_pool: must be 1..256";
    else if (c.prefix.empty() || c.prefix[0] != '/' || c.prefix.back() == '/')
        error = "prefix: must start with '/' and not end with one";
    for (size_t i = 0; i < c.postgres.size() && error.empty(); ++i) {
        const auto & u = c.postgres[i];
        // Named by position: the URL may hold a password.
        if (u.rfind("postgres://", 0) != 0 && u.rfind("postgresql://", 0) != 0)
            error = "postgres[" + std::to_string(i) + "]: not a postgres:// URL";
    }
    if (!error.empty()) return std::nullopt;
    // TLS to PostgreSQL is libpq's own: the server's certificate checked against the CA and the
    // host name (verify-full), or only encrypted when no CA is named.
    if (c.postgres_auth.tls()) {
        // libpq 15 has no "system" CA store: a server is checked against the named CA or not at
        // all, and not at all is not offered.
        if (c.postgres_auth.ca_file.empty()) {
            error = "credentials.postgres: name the CA (ca_file) that signed the server's certificate";
            return std::nullopt;
        }
        const auto enc = [](const std::string & path) { return common::percent_encode(path, true); };
        for (auto & u : c.postgres) {
            std::string q = "sslmode=verify-full&sslrootcert=" + enc(c.postgres_auth.ca_file);
            if (!c.postgres_auth.cert_file.empty())
                q += "&sslcert=" + enc(c.postgres_auth.cert_file) + "&sslkey=" + enc(c.postgres_auth.key_file);
            u += (u.find('?') == std::string::npos ? "?" : "&") + q;
        }
    }
    return c;
}

EtcdClient make_etcd(const ClusterConfig & c, int timeout_ms) {
    EtcdClient e(c.etcd, timeout_ms);
    if (!c.etcd_auth.user.empty()) e.set_credentials(c.etcd_auth.user, c.etcd_auth.password);
    const bool https =
        std::any_of(c.etcd.begin(), c.etcd.end(), [](const std::string & ep) { return ep.rfind("https://", 0) == 0; });
    if (c.etcd_auth.tls() || https) {
        // The files were checked when the cluster file was read; should they fail now, every
        // call fails with why, and none goes out in the clear.
        std::string err;
        auto tls = service_tls(c.etcd_auth, "etcd", err);
        e.set_tls(std::move(tls), err);
    }
    return e;
}

std::optional<ClusterConfig> load_cluster_config(const std::string & path, std::string & error) {
    std::ifstream f(path);
    if (!f) {
        error = "cannot read cluster file " + path;
        return std::nullopt;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    auto c = parse_cluster_config(ss.str(), error);
    if (!c) error = path + ": " + error;
    return c;
}

std::optional<ClusterConfig> load_cluster_config_for_service(const std::string & path, std::string & error) {
    auto cfg = load_cluster_config(path, error);
    if (!cfg) {
        error = "--cluster " + path + ": " + error;
        return std::nullopt;
    }
    if (cfg->postgres.empty() || cfg->etcd.empty() || cfg->nats.empty()) {
        error = "--cluster " + path + " must name etcd, nats and postgres";
        return std::nullopt;
    }
    return cfg;
}

std::string node_key(const ClusterConfig & c, const std::string & cell, const std::string & node) {
    return ClusterKeys(c.prefix).node(cell, node);
}

std::string nodes_prefix(const ClusterConfig & c, const std::string & cell) {
    return ClusterKeys(c.prefix).nodes(cell);
}

std::string brain_election(const ClusterConfig & c, const std::string & cell) {
    return ClusterKeys(c.prefix).cell_election(cell);
}

std::string cell_report_key(const ClusterConfig & c, const std::string & cell) {
    return ClusterKeys(c.prefix).cell_report(cell);
}

std::string cell_failovers_key(const ClusterConfig & c, const std::string & cell) {
    return ClusterKeys(c.prefix).cell_failovers(cell);
}

std::string cells_prefix(const ClusterConfig & c) {
    return ClusterKeys(c.prefix).cells();
}

std::string global_election(const ClusterConfig & c) {
    return ClusterKeys(c.prefix).global_election();
}

std::string shares_key(const ClusterConfig & c) {
    return ClusterKeys(c.prefix).shares();
}

std::string gateways_prefix(const ClusterConfig & c) {
    return ClusterKeys(c.prefix).gateways();
}

bool valid_cell_or_node_name(const std::string & s) {
    return valid_name(s);
}

}  // namespace armada::cluster

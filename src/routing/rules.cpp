#include "routing/rules.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>

namespace armada::routing {

namespace {

bool pool_name_ok(const std::string & s) {
    if (s.empty() || s.size() > 63 || s == "cpu") return false;
    return std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    });
}

//! The first key of map `n` not in `known`, or "".
std::string unknown_key(const YAML::Node & n, std::initializer_list<const char *> known) {
    for (const auto & kv : n) {
        std::string k = kv.first.as<std::string>();
        if (std::find_if(known.begin(), known.end(), [&](const char * x) { return k == x; }) == known.end()) return k;
    }
    return {};
}

std::vector<std::string> one_or_list(const YAML::Node & n) {
    std::vector<std::string> out;
    if (n.IsScalar()) out.push_back(n.as<std::string>());
    if (n.IsSequence()) {
        for (const auto & v : n)
            out.push_back(v.as<std::string>());
    }
    return out;
}

std::string join(const std::vector<std::string> & v) {
    std::string s;
    for (const auto & x : v)
        s += (s.empty() ? "" : "|") + x;
    return s;
}

bool parse_upstream(const YAML::Node & n, const std::string & where, UpstreamConfig & u, std::string & error) {
    if (!n.IsMap()) {
        error = where + ": must be a map {url, model, ...}";
        return false;
    }
    if (auto k =
            unknown_key(n, {"url", "model", "api_key_env", "api_key_file", "max_in_flight", "grammar", "cache_salt"});
        !k.empty()) {
        error = where + ": unknown setting '" + k + "'";
        return false;
    }
    if (n["url"]) u.url = n["url"].as<std::string>();
    if (n["model"]) u.model = n["model"].as<std::string>();
    if (n["api_key_env"]) u.api_key_env = n["api_key_env"].as<std::string>();
    if (n["api_key_file"]) u.api_key_file = n["api_key_file"].as<std::string>();
    if (n["max_in_flight"]) u.max_in_flight = n["max_in_flight"].as<int>();
    if (n["cache_salt"]) u.cache_salt = n["cache_salt"].as<bool>();
    while (!u.url.empty() && u.url.back() == '/')
        u.url.pop_back();
    if (u.url.rfind("http://", 0) != 0 || u.url.size() <= 7) {
        error = where + ".url: must be an http:// URL (the base the /v1 routes hang from)";
        return false;
    }
    if (u.url.find('/', 7) != std::string::npos) {
        error = where +
                ".url: give the server's base, http://host:port, without a path (the gateway adds "
                "/v1/chat/completions, /v1/completions and /health itself)";
        return false;
    }
    if (u.url.find('@') != std::string::npos || u.url.find('?') != std::string::npos) {
        error = where + ".url: no credentials or query in the URL; give the key with api_key_env or api_key_file";
        return false;
    }
    if (u.model.empty()) {
        error = where + ".model: the model name the upstream serves is needed";
        return false;
    }
    if (!u.api_key_env.empty() && !u.api_key_file.empty()) {
        error = where + ": give api_key_env or api_key_file, not both";
        return false;
    }
    if (u.max_in_flight < 1 || u.max_in_flight > 100000) {
        error = where + ".max_in_flight: must be 1..100000";
        return false;
    }
    if (n["grammar"]) {
        const std::string g = n["grammar"].as<std::string>();
        if (g == "llama")
            u.grammar = GrammarDialect::llama;
        else if (g == "json_schema")
            u.grammar = GrammarDialect::json_schema;
        else {
            error = where + ".grammar: must be llama (llama.cpp grammar) or json_schema (OpenAI response_format)";
            return false;
        }
    }
    return true;
}

bool parse_pool(const YAML::Node & n, const std::string & where, PoolConfig & p, std::string & error) {
    if (!n.IsMap()) {
        error = where + ": must be a map {name, upstreams, ...}";
        return false;
    }
    if (auto k = unknown_key(
            n, {"name", "upstreams", "context", "timeout_ms", "health_ms", "breaker_errors", "breaker_open_ms"});
        !k.empty()) {
        error = where + ": unknown setting '" + k + "'";
        return false;
    }
    if (n["name"]) p.name = n["name"].as<std::string>();
    if (!pool_name_ok(p.name)) {
        error = where + ".name: must be 1..63 of A-Z a-z 0-9 . _ - (and not 'cpu')";
        return false;
    }
    if (n["context"]) p.context = n["context"].as<int64_t>();
    if (n["timeout_ms"]) p.timeout_ms = n["timeout_ms"].as<int>();
    if (n["health_ms"]) p.health_ms = n["health_ms"].as<int>();
    if (n["breaker_errors"]) p.breaker_errors = n["breaker_errors"].as<int>();
    if (n["breaker_open_ms"]) p.breaker_open_ms = n["breaker_open_ms"].as<int>();
    if (p.context < 0) {
        error = where + ".context: must be 0 (not known) or more";
        return false;
    }
    if (p.timeout_ms < 100 || p.timeout_ms > 3600000) {
        error = where + ".timeout_ms: must be 100..3600000";
        return false;
    }
    if (p.health_ms < 100 || p.health_ms > 600000) {
        error = where + ".health_ms: must be 100..600000";
        return false;
    }
    if (p.breaker_errors < 1 || p.breaker_errors > 1000) {
        error = where + ".breaker_errors: must be 1..1000";
        return false;
    }
    if (p.breaker_open_ms < 100 || p.breaker_open_ms > 3600000) {
        error = where + ".breaker_open_ms: must be 100..3600000";
        return false;
    }
    const auto ups = n["upstreams"];
    if (!ups || !ups.IsSequence() || ups.size() == 0) {
        error = where + ".upstreams: a list of at least one {url, model} is needed";
        return false;
    }
    for (size_t i = 0; i < ups.size(); ++i) {
        UpstreamConfig u;
        if (!parse_upstream(ups[i], where + ".upstreams[" + std::to_string(i) + "]", u, error)) return false;
        for (const auto & o : p.upstreams) {
            if (o.url == u.url) {
                error = where + ".upstreams[" + std::to_string(i) + "]: " + u.url + " is listed twice";
                return false;
            }
        }
        p.upstreams.push_back(std::move(u));
    }
    return true;
}

bool parse_rule(const YAML::Node & n, const std::string & where, const std::vector<PoolConfig> & pools, RouteRule & r,
                std::string & error) {
    if (!n.IsMap()) {
        error = where + ": must be a map {when: {...}, to: POOL}";
        return false;
    }
    if (auto k = unknown_key(n, {"name", "when", "to"}); !k.empty()) {
        error = where + ": unknown setting '" + k + "'";
        return false;
    }
    if (n["to"]) r.to = n["to"].as<std::string>();
    if (r.to != "cpu" && std::none_of(pools.begin(), pools.end(), [&](const auto & p) { return p.name == r.to; })) {
        error = where + ".to: '" + r.to + "' is neither cpu nor a pool of this file";
        return false;
    }
    std::vector<std::string> parts;
    if (const auto w = n["when"]) {
        if (!w.IsMap()) {
            error = where + ".when: must be a map of conditions";
            return false;
        }
        if (auto k =
                unknown_key(w, {"prompt_tokens_over", "max_tokens_over", "latency", "model", "long_step", "tenant"});
            !k.empty()) {
            error = where + ".when: unknown condition '" + k +
                    "' (there are prompt_tokens_over, max_tokens_over, latency, model, long_step and tenant)";
            return false;
        }
        if (w["prompt_tokens_over"]) {
            r.prompt_tokens_over = w["prompt_tokens_over"].as<int64_t>();
            parts.push_back("prompt_tokens>" + std::to_string(*r.prompt_tokens_over));
        }
        if (w["max_tokens_over"]) {
            r.max_tokens_over = w["max_tokens_over"].as<int64_t>();
            parts.push_back("max_tokens>" + std::to_string(*r.max_tokens_over));
        }
        if (w["long_step"]) {
            if (!w["long_step"].as<bool>()) {
                error = where + ".when.long_step: only `true` is a condition (leave it out otherwise)";
                return false;
            }
            r.long_step = true;
            parts.push_back("long_step");
        }
        if (w["latency"]) {
            r.latency = one_or_list(w["latency"]);
            if (r.latency.empty()) {
                error = where + ".when.latency: name one latency class or a list of them";
                return false;
            }
            parts.push_back("latency=" + join(r.latency));
        }
        if (w["tenant"]) {
            r.tenant = one_or_list(w["tenant"]);
            if (r.tenant.empty()) {
                error = where + ".when.tenant: name one tenant or a list of them";
                return false;
            }
            parts.push_back("tenant=" + join(r.tenant));
        }
        if (w["model"]) {
            r.model = one_or_list(w["model"]);
            if (r.model.empty()) {
                error = where + ".when.model: name one model or a list of them";
                return false;
            }
            parts.push_back("model=" + join(r.model));
        }
        if ((r.prompt_tokens_over && *r.prompt_tokens_over < 0) || (r.max_tokens_over && *r.max_tokens_over < 0)) {
            error = where + ".when: token thresholds must be 0 or more";
            return false;
        }
    }
    if (n["name"]) {
        r.name = n["name"].as<std::string>();
        // It goes into a response header (X-Armada-Route-Rule) and a metric label.
        if (r.name.empty() || r.name.size() > 64 || !std::all_of(r.name.begin(), r.name.end(), [](char c) {
                return c > ' ' && c < 127 && c != '"' && c != '\\';
            })) {
            error = where + ".name: 1..64 printable characters, no spaces or quotes";
            return false;
        }
    } else {
        std::string s;
        for (const auto & p : parts)
            s += (s.empty() ? "" : ",") + p;
        r.name = s.empty() ? "always" : s;
    }
    return true;
}

}  // namespace

const PoolConfig * RoutingConfig::pool(const std::string & name) const {
    for (const auto & p : pools) {
        if (p.name == name) return &p;
    }
    return nullptr;
}

std::vector<RouteRule> default_routes(const std::vector<PoolConfig> & pools) {
    std::vector<RouteRule> out;
    if (std::none_of(pools.begin(), pools.end(), [](const auto & p) { return p.name == "gpu"; })) return out;
    RouteRule ctx;
    ctx.name = "prompt_tokens>8192";
    ctx.prompt_tokens_over = 8192;
    ctx.to = "gpu";
    RouteRule gen;
    gen.name = "max_tokens>500";
    gen.max_tokens_over = 500;
    gen.to = "gpu";
    RouteRule marked;
    marked.name = "long_step";
    marked.long_step = true;
    marked.to = "gpu";
    out.push_back(ctx);
    out.push_back(gen);
    out.push_back(marked);
    return out;
}

std::optional<RoutingConfig> load_routing_file(const std::string & path, const std::string & tokenizer,
                                               std::string & error) {
    RoutingConfig out;
    try {
        YAML::Node root = YAML::LoadFile(path);
        if (!root.IsMap()) {
            error = path + ": must be a map with pools (and routes, tenant_latency)";
            return std::nullopt;
        }
        if (!root["tokenizer"]) root["tokenizer"] = tokenizer;
        if (!parse_routing(root, out, error)) {
            error = path + ": " + error;
            return std::nullopt;
        }
    } catch (const YAML::Exception & e) {
        error = path + ": " + e.what();
        return std::nullopt;
    }
    if (out.pools.empty()) {
        error = path + ": names no pools";
        return std::nullopt;
    }
    return out;
}

bool parse_routing(const YAML::Node & root, RoutingConfig & out, std::string & error) {
    if (root["tokenizer"]) out.tokenizer = root["tokenizer"].as<std::string>();
    if (const auto pools = root["pools"]) {
        if (!pools.IsSequence()) {
            error = "pools: must be a list of {name, upstreams, ...}";
            return false;
        }
        for (size_t i = 0; i < pools.size(); ++i) {
            PoolConfig p;
            if (!parse_pool(pools[i], "pools[" + std::to_string(i) + "]", p, error)) return false;
            if (out.pool(p.name)) {
                error = "pools[" + std::to_string(i) + "]: '" + p.name + "' is listed twice";
                return false;
            }
            out.pools.push_back(std::move(p));
        }
    }
    if (const auto routes = root["routes"]) {
        if (!routes.IsSequence()) {
            error = "routes: must be a list of {when: {...}, to: POOL}";
            return false;
        }
        for (size_t i = 0; i < routes.size(); ++i) {
            RouteRule r;
            if (!parse_rule(routes[i], "routes[" + std::to_string(i) + "]", out.pools, r, error)) return false;
            out.routes.push_back(std::move(r));
        }
    } else {
        out.routes = default_routes(out.pools);
    }
    if (const auto t = root["tenant_latency"]) {
        if (!t.IsMap()) {
            error = "tenant_latency: must be a map of tenant name to latency class";
            return false;
        }
        for (const auto & kv : t)
            out.tenant_latency[kv.first.as<std::string>()] = kv.second.as<std::string>();
    }
    if (root["default_latency"]) out.default_latency = root["default_latency"].as<std::string>();
    if (const auto c = root["latency_classes"]) {
        out.latency_classes = one_or_list(c);
        if (out.latency_classes.empty()) {
            error = "latency_classes: list the classes, most urgent first";
            return false;
        }
    }
    if (const auto t = root["tenant_latency_max"]) {
        if (!t.IsMap()) {
            error = "tenant_latency_max: must be a map of tenant name to the most urgent class its clients may ask for";
            return false;
        }
        for (const auto & kv : t)
            out.tenant_latency_max[kv.first.as<std::string>()] = kv.second.as<std::string>();
    }
    auto known = [&](const std::string & c) {
        return std::find(out.latency_classes.begin(), out.latency_classes.end(), c) != out.latency_classes.end();
    };
    for (const auto * m : {&out.tenant_latency, &out.tenant_latency_max}) {
        for (const auto & [tenant, c] : *m) {
            if (!known(c)) {
                error = std::string(m == &out.tenant_latency ? "tenant_latency" : "tenant_latency_max") + "." + tenant +
                        ": '" + c + "' is not one of latency_classes (" + join(out.latency_classes) + ")";
                return false;
            }
        }
    }
    if (!known(out.default_latency)) {
        error = "default_latency: '" + out.default_latency + "' is not one of latency_classes (" +
                join(out.latency_classes) + ")";
        return false;
    }
    const bool counts = std::any_of(out.routes.begin(), out.routes.end(),
                                    [](const auto & r) { return r.prompt_tokens_over.has_value(); });
    if (counts && out.tokenizer.empty()) {
        error = std::string("tokenizer: ") +
                (root["routes"] ? "a rule routes" : "the default rules for pool 'gpu' route") +
                " by prompt tokens, so the file must name a GGUF whose vocabulary counts them (the nodes' model "
                "file; only its vocabulary is loaded)";
        return false;
    }
    return true;
}

std::optional<std::string> RoutingConfig::latency_for(const std::string & tenant, const std::string & asked, bool admin,
                                                      std::string & error) const {
    auto rank = [&](const std::string & c) -> int {
        const auto it = std::find(latency_classes.begin(), latency_classes.end(), c);
        return it == latency_classes.end() ? -1 : int(it - latency_classes.begin());
    };
    const auto t = tenant_latency.find(tenant);
    const std::string own = t != tenant_latency.end() ? t->second : default_latency;
    if (asked.empty()) return own;
    const int want = rank(asked);
    if (want < 0) {
        error = "X-Armada-Latency: '" + asked + "' is not a latency class of this cluster (" + join(latency_classes) +
                ", most urgent first)";
        return std::nullopt;
    }
    // Lowering is always allowed; raising up to the tenant's ceiling (its own class when none is
    // set); an admin key may ask for any.
    const auto m = tenant_latency_max.find(tenant);
    const int ceiling = rank(m != tenant_latency_max.end() ? m->second : own);
    if (admin || want >= ceiling || (ceiling < 0 && want >= rank(own))) return asked;
    error = "X-Armada-Latency: '" + asked + "' is more urgent than tenant '" + tenant + "' may ask for (at most '" +
            latency_classes[size_t(std::max(0, ceiling))] + "'; tenant_latency_max in the cluster file raises it)";
    return std::nullopt;
}

RouteChoice choose_route(const std::vector<RouteRule> & rules, const RouteFacts & f) {
    for (const auto & r : rules) {
        if (r.prompt_tokens_over && !(f.prompt_tokens >= 0 && f.prompt_tokens > *r.prompt_tokens_over)) continue;
        if (r.max_tokens_over && !(f.max_tokens >= 0 && f.max_tokens > *r.max_tokens_over)) continue;
        if (!r.latency.empty() && std::find(r.latency.begin(), r.latency.end(), f.latency) == r.latency.end()) continue;
        if (r.long_step && !f.long_step) continue;
        if (!r.model.empty() && std::find(r.model.begin(), r.model.end(), f.model) == r.model.end()) continue;
        if (!r.tenant.empty() && std::find(r.tenant.begin(), r.tenant.end(), f.tenant) == r.tenant.end()) continue;
        return {r.to, r.name};
    }
    return {"cpu", "default"};
}

}  // namespace armada::routing

#include "api/auth.h"

#include "common/hash.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace armada::api {

bool constant_time_equal(const std::string & a, const std::string & b) {
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff |= static_cast<unsigned char>(x ^ y);
    }
    return diff == 0;
}

std::string owner_of(const std::string & api_key) {
    if (api_key.empty()) return {};
    const uint64_t h = common::fnv1a64(api_key);
    char buf[17];
    snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

void ApiKeys::add(const std::string & key, bool admin) {
    if (!key.empty()) keys_.push_back({key, owner_of(key), admin, std::nullopt});
}

bool valid_tenant_name(const std::string & n) {
    if (n.empty() || n.size() > 64) return false;
    for (char c : n) {
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
    }
    return true;
}

std::optional<Caller> acting_as(const std::string & id) {
    if (id.rfind("t:", 0) != 0 || !valid_tenant_name(id.substr(2))) return std::nullopt;
    Caller c;
    c.tenant = id;
    c.tenant_name = id.substr(2);
    c.account = owner_of(id);  // no limits of its own here: the gateways hold the tenant's quotas
    return c;
}

namespace {

bool number(const std::string & text, double & v) {
    try {
        size_t used = 0;
        v = std::stod(text, &used);
        return used == text.size() && v >= 0;
    } catch (const std::exception &) {
        return false;
    }
}
}  // namespace

std::string ApiKeys::load_flags(const std::string & key, const std::string & file) {
    add(key);
    return file.empty() ? std::string() : load_file(file);
}

std::string ApiKeys::load_file(const std::string & path) {
    std::ifstream f(path);
    if (!f) return "cannot read API key file " + path;
    std::string line;
    int n = 0;
    while (std::getline(f, line)) {
        ++n;
        std::istringstream words(line);
        std::string key, opt;
        if (!(words >> key) || key[0] == '#') continue;
        const std::string where = path + ":" + std::to_string(n) + ": ";
        Key k{key, owner_of(key), false, std::nullopt};
        while (words >> opt) {
            const auto eq = opt.find('=');
            const std::string name = opt.substr(0, eq);
            const std::string value = eq == std::string::npos ? "" : opt.substr(eq + 1);
            double v = 0;
            if (opt == "admin") {
                k.admin = true;
            } else if (name == "tenant" && eq != std::string::npos) {
                if (!valid_tenant_name(value))
                    return where + "tenant '" + value + "' must be 1 to 64 letters, digits, '_', '-' or '.'";
                k.tenant = tenant_id(value);
            } else if ((name == "rpm" || name == "tpm") && eq != std::string::npos && number(value, v)) {
                if (!k.limits) k.limits = RateLimits{};
                (name == "rpm" ? k.limits->requests_per_min : k.limits->tokens_per_min) = v;
            } else {
                return where + "expected 'tenant=NAME', 'admin', 'rpm=N' or 'tpm=N' after the key, got '" + opt + "'";
            }
        }
        keys_.push_back(std::move(k));
    }
    return {};
}

std::string presented_key(const std::string & authorization, const std::string & x_api_key) {
    static const std::string bearer = "Bearer ";
    if (authorization.size() > bearer.size() && authorization.compare(0, bearer.size(), bearer) == 0)
        return authorization.substr(bearer.size());
    return x_api_key;
}

const ApiKeys::Key * ApiKeys::check(const std::string & authorization, const std::string & x_api_key) const {
    const std::string presented = presented_key(authorization, x_api_key);
    if (presented.empty()) return nullptr;
    const Key * match = nullptr;
    // Every key is compared, so timing does not reveal which one matched.
    for (const auto & k : keys_) {
        if (constant_time_equal(k.key, presented)) match = &k;
    }
    return match;
}

Caller ApiKeys::caller(const Key * k) const {
    Caller c;
    if (!k) {
        c.admin = !enabled();  // no keys: the node is the caller's own
        return c;
    }
    c.tenant = k->tenant;
    c.tenant_name = tenant_name(k->tenant);
    c.account = owner_of(k->key);
    c.admin = k->admin;
    return c;
}

}  // namespace armada::api

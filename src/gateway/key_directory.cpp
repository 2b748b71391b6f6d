#include "gateway/key_directory.h"

#include "cluster/etcd.h"
#include "common/clock.h"
#include "gateway/checks.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <strings.h>

#include <stdexcept>
#include <vector>

namespace armada::gateway {

namespace {

std::string hex_of(const unsigned char * p, size_t n) {
    static const char * d = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; ++i) {
        s += d[p[i] >> 4];
        s += d[p[i] & 15];
    }
    return s;
}

}  // namespace

std::string key_hash(const std::string & key) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_Digest(key.data(), key.size(), md, &n, EVP_sha256(), nullptr);
    return hex_of(md, n);
}

std::string random_hex(size_t bytes) {
    std::vector<unsigned char> b(bytes);
    if (RAND_bytes(b.data(), int(bytes)) != 1) throw std::runtime_error("no randomness for a new key");
    return hex_of(b.data(), bytes);
}

void basic_as_bearer(api::HttpRequest & req) {
    const std::string a = req.header("authorization");
    if (a.size() < 6 || strncasecmp(a.c_str(), "basic ", 6) != 0) return;
    size_t b = 6;
    while (b < a.size() && a[b] == ' ')
        ++b;
    const auto decoded = cluster::EtcdClient::unbase64(a.substr(b));
    // Not Basic after all, or bytes no header may hold: refused as an unknown key.
    if (!decoded || !header_value_ok(*decoded)) return;
    const size_t colon = decoded->find(':');
    req.headers["authorization"] = "Bearer " + (colon == std::string::npos ? *decoded : decoded->substr(colon + 1));
}

KeyDirectory::KeyDirectory(store::Directory & dir, api::ApiKeys keys, const std::string & admin_key)
    : dir_(dir), keys_(std::move(keys)), forward_key_(admin_key) {
    for (const auto & k : keys_.keys()) {
        if (forward_key_.empty() && k.admin) forward_key_ = k.key;
    }
}

bool KeyDirectory::load() {
    loaded_ms_ = common::steady_ms();
    auto tenants = dir_.tenants();
    auto keys = tenants ? dir_.keys() : std::nullopt;
    if (!tenants || !keys) {
        if (!warned_) spdlog::warn("gateway: cannot read tenants and keys from PostgreSQL; using the last ones read");
        warned_ = true;
        return false;
    }
    warned_ = false;
    auto d = std::make_shared<Cached>();
    for (auto & t : *tenants)
        d->tenants[t.name] = std::move(t);
    for (auto & k : *keys)
        d->by_hash[k.hash] = std::move(k);
    std::lock_guard lk(mu_);
    cached_ = std::move(d);
    return true;
}

void KeyDirectory::refresh() {
    if (common::steady_ms() - loaded_ms_ >= kTtlMs) load();
}

std::shared_ptr<const KeyDirectory::Cached> KeyDirectory::cached() {
    std::lock_guard lk(mu_);
    return cached_;
}

bool KeyDirectory::ready() {
    return keys_.enabled() || cached() != nullptr;
}

std::optional<Authed> KeyDirectory::authenticate(const api::HttpRequest & req) {
    auto dir = cached();
    Authed a;
    const std::string auth = req.header("authorization"), xkey = req.header("x-api-key");
    if (keys_.enabled()) a.file_key = keys_.check(auth, xkey);
    if (a.file_key) {
        a.caller = keys_.caller(a.file_key);
        // An admin acting as a tenant is that tenant here too (owner, quotas), as on a node.
        if (const std::string as = req.header("x-armada-tenant"); a.caller.admin && !as.empty()) {
            auto acting = api::acting_as(as);
            if (!acting) {
                a.bad_tenant = true;
                return a;
            }
            a.caller = std::move(*acting);
            a.acting = true;
        }
    } else if (dir && !dir->by_hash.empty()) {
        const std::string presented = api::presented_key(auth, xkey);
        auto it = presented.empty() ? dir->by_hash.end() : dir->by_hash.find(key_hash(presented));
        if (it == dir->by_hash.end()) return std::nullopt;
        a.caller.tenant = api::tenant_id(it->second.tenant);
        a.caller.tenant_name = it->second.tenant;
        a.caller.account = it->second.id;
        a.caller.admin = it->second.admin;
        a.from_directory = true;
    } else if (keys_.enabled()) {
        return std::nullopt;
    } else {
        a.caller = keys_.caller(nullptr);
    }
    // The tenant's quotas, whichever key it came with.
    if (dir && a.caller.tenant.rfind("t:", 0) == 0) {
        if (auto it = dir->tenants.find(a.caller.tenant_name); it != dir->tenants.end())
            a.quota = {it->second.rpm, it->second.tpm, it->second.live_sessions, it->second.kv_bytes};
    }
    return a;
}

void KeyDirectory::rewrite_identity(api::HttpRequest & req, const Authed & a) const {
    if (!a.acting) req.headers.erase("x-armada-tenant");
    if (!a.from_directory) return;
    req.headers.erase("x-api-key");
    req.headers.erase("authorization");
    if (!forward_key_.empty()) req.headers["authorization"] = "Bearer " + forward_key_;
    req.headers["x-armada-tenant"] = a.caller.tenant;
}

}  // namespace armada::gateway

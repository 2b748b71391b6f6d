#pragma once

// Who a request through the gateway comes from. Keys come from two places: the gateway's own
// (--api-key, --api-key-file), and the tenants' keys in the cluster's directory (PostgreSQL,
// store/directory.h), read again every couple of seconds and looked up by their SHA-256 only.
// A request with a directory key goes on to the nodes under the gateway's own admin key, acting
// as the tenant: the nodes know only the gateway's keys.
//
// Owns: authentication, the cached directory, and the identity a request carries downstream. It
// may include api/ (keys, callers) and store/directory.h, nothing of the relay or the routes.

#include "api/auth.h"
#include "api/http_server.h"
#include "cluster/quota.h"
#include "store/directory.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace armada::gateway {

//! Who a request comes from, as the gateway checked it.
struct Authed {
    api::Caller caller;
    const api::ApiKeys::Key * file_key = nullptr;  // --api-key / --api-key-file
    bool from_directory = false;                   // a key from PostgreSQL
    bool acting = false;                           // an admin's X-Armada-Tenant, kept for the nodes
    bool bad_tenant = false;                       // an admin's X-Armada-Tenant that is not t:NAME
    cluster::TenantQuota quota;                    // the tenant's, when PostgreSQL has the tenant
};

//! How API keys from the directory are looked up: their SHA-256 (hex), never the key.
std::string key_hash(const std::string & key);
//! `bytes` random bytes as hex (new keys and their ids); throws when the system has no randomness.
std::string random_hex(size_t bytes);
//! `Authorization: Basic base64(user:key)` as `Bearer key` (any user name): how a browser opens
//! the dashboard. Anything else is left as it is.
void basic_as_bearer(api::HttpRequest & req);

class KeyDirectory {
  public:
    //! How long a read of the directory is used before the next.
    static constexpr int64_t kTtlMs = 2000;

    //! `admin_key`: the key the gateway forwards under ("" takes the first admin key of `keys`).
    KeyDirectory(store::Directory & dir, api::ApiKeys keys, const std::string & admin_key);

    //! Reads tenants and keys again; false (keeping the last ones read) when they cannot be read.
    bool load();
    //! Loads again when the last load is older than kTtlMs.
    void refresh();
    //! Whether callers can be told apart yet: the gateway has keys of its own, or has read the
    //! directory once (without either, whether a key is needed is not known).
    bool ready();
    //! The caller of `req`, or nullopt when authentication is on and its key is unknown.
    std::optional<Authed> authenticate(const api::HttpRequest & req);
    //! What the nodes see: a key from the directory is not theirs, so the request goes on under
    //! the gateway's own (admin) key, acting as the tenant. Only an admin may name a tenant itself.
    void rewrite_identity(api::HttpRequest & req, const Authed & a) const;
    //! The gateway's own admin key ("" when it has none: /admin is then refused).
    const std::string & forward_key() const { return forward_key_; }

  private:
    //! Tenants and their keys as the directory had them at the last load.
    struct Cached {
        std::map<std::string, store::TenantRecord> tenants;  // by name
        std::map<std::string, store::KeyRecord> by_hash;
    };
    std::shared_ptr<const Cached> cached();

    store::Directory & dir_;
    api::ApiKeys keys_;
    std::string forward_key_;
    std::atomic<int64_t> loaded_ms_{0};  // the last load
    std::atomic<bool> warned_{false};
    std::mutex mu_;
    std::shared_ptr<const Cached> cached_;  // mu_
};

}  // namespace armada::gateway

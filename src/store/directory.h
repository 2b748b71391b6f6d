#pragma once

// Tenants and their API keys: the directory a cluster's gateways authenticate against and manage
// through their /admin API. PostgreSQL holds it (`PostgresStore`); a node's own keys come from its
// flags and files instead. Callers need only this interface, not the store behind it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace armada::store {

//! A tenant, as the gateways' admin API manages it. A quota of 0 is unlimited.
struct TenantRecord {
    std::string name;
    int64_t rpm = 0;            // requests per minute
    int64_t tpm = 0;            // model tokens per minute
    int64_t live_sessions = 0;  // sessions not yet ended
    int64_t kv_bytes = 0;       // KV cache held on nodes
    int64_t created_ms = 0, updated_ms = 0;
};

//! An API key of a tenant. Only the key's SHA-256 is stored; `id` and `prefix` name it in
//! listings and logs.
struct KeyRecord {
    std::string id, hash, tenant, prefix;
    bool admin = false;
    int64_t created_ms = 0;
};

//! How a change to tenants or keys went.
enum class AdminResult { ok, exists, missing, unavailable };

class Directory {
  public:
    virtual ~Directory() = default;
    //! Every tenant, and every key; nullopt when the store cannot be read.
    virtual std::optional<std::vector<TenantRecord>> tenants() = 0;
    virtual std::optional<std::vector<KeyRecord>> keys() = 0;
    virtual AdminResult create_tenant(const TenantRecord & t) = 0;
    //! Sets the quotas of an existing tenant.
    virtual AdminResult update_tenant(const TenantRecord & t) = 0;
    //! Removes the tenant and its keys (its sessions stay until they expire).
    virtual AdminResult delete_tenant(const std::string & name) = 0;
    //! `missing` when the tenant does not exist.
    virtual AdminResult create_key(const KeyRecord & k) = 0;
    virtual AdminResult delete_key(const std::string & id) = 0;
};

}  // namespace armada::store

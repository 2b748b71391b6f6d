#pragma once

#include "common/tenant.h"

#include "api/rate_limit.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace armada::api {

//! Compares in time that depends only on the lengths, not on where the strings differ.
bool constant_time_equal(const std::string & a, const std::string & b);

//! Stable short hash of an API key (never the key itself): a key's rate-limit account, and the
//! tenant of a key that names none.
std::string owner_of(const std::string & api_key);

//! Who is calling, as the routes see it.
struct Caller {
    //! The tenant's id: "t:NAME" for a named tenant, the key's hash for a key of its own, ""
    //! when authentication is off. Sessions, responses and API agents belong to it.
    std::string tenant;
    std::string tenant_name;  // as configured, for messages and listings; "" when off
    std::string account;      // rate limits: the key's hash
    bool admin = false;       // may manage every tenant's agents, read /metrics
};

// Tenant ids and names (common/tenant.h).
using common::tenant_id;
using common::tenant_name;

//! The key a request presents: `Authorization: Bearer <key>`, else `x-api-key`; "" when none.
std::string presented_key(const std::string & authorization, const std::string & x_api_key);

//! A tenant's name: 1 to 64 letters, digits, '_', '-' or '.'.
bool valid_tenant_name(const std::string & name);

//! The caller an admin acts as when it sends `X-Armada-Tenant: t:NAME` (a gateway forwarding
//! for a tenant whose key it checked): that tenant, not an admin. Nullopt when `tenant_id` is
//! not of that form.
std::optional<Caller> acting_as(const std::string & tenant_id);

//! API keys accepted by the server. Empty means authentication is off.
class ApiKeys {
  public:
    struct Key {
        std::string key;
        std::string tenant;  // tenant id (see Caller)
        bool admin = false;
        std::optional<RateLimits> limits;
    };
    //! `--api-key`: the operator's own key, an admin.
    void add(const std::string & key, bool admin = true);
    //! Reads one key per line: `KEY [tenant=NAME] [admin] [rpm=N] [tpm=N]`. Blank lines and lines
    //! starting with '#' are skipped. A key without a tenant is a tenant of its own.
    //! Returns an error message naming the line, empty on success.
    std::string load_file(const std::string & path);
    //! The keys a command's `--api-key` and `--api-key-file` give (either may be empty). Returns
    //! an error message naming the file's bad line, empty on success.
    std::string load_flags(const std::string & key, const std::string & file);
    bool enabled() const { return !keys_.empty(); }
    //! Checks `Authorization: Bearer <key>` or `x-api-key: <key>`; the matching key, or null.
    const Key * check(const std::string & authorization, const std::string & x_api_key) const;
    //! The caller a key stands for (or the anonymous caller when `k` is null and keys are off).
    Caller caller(const Key * k) const;
    const std::vector<Key> & keys() const { return keys_; }

  private:
    std::vector<Key> keys_;
};

}  // namespace armada::api

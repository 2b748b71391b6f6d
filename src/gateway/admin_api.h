#pragma once

// /admin on a gateway: tenants and their API keys in the cluster's directory (PostgreSQL), and
// the GPU pools' state. Admin keys only; a new key is shown once, in the answer that makes it.
//
// Owns: the admin routes. It may include the key directory (to read changes at once) and
// store/directory.h; nothing of the relay or the session routes.

#include "api/auth.h"
#include "api/http_server.h"
#include "gateway/key_directory.h"
#include "routing/pool_set.h"
#include "store/directory.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace armada::gateway {

class AdminApi {
  public:
    //! `pools` may be null (the cluster has none).
    AdminApi(store::Directory & dir, KeyDirectory & keys, routing::PoolSet * pools)
        : dir_(dir), keys_(keys), pools_(pools) {}
    //! A request under /admin (`parts`: its path split at '/').
    void route(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out, const api::Caller & caller,
               const std::vector<std::string> & parts);

  private:
    //! POST /admin/tenants (a new one, `name` in the body) or PATCH /admin/tenants/NAME (its quotas).
    void put_tenant(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                    const std::optional<std::string> & name);
    //! POST /admin/keys: a new key for a tenant; the key is in this answer only.
    void create_key(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out);

    store::Directory & dir_;
    KeyDirectory & keys_;
    routing::PoolSet * pools_;
};

}  // namespace armada::gateway

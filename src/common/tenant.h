#pragma once

// A tenant's id and name. The API, the store and routing all name tenants; the id is what
// sessions and keys carry ("t:NAME"), the name is what the operator writes in configuration.

#include <string>

namespace armada::common {

//! The id of a named tenant. A key's hash has no ':', so a named tenant never collides with a
//! key of its own.
inline std::string tenant_id(const std::string & name) {
    return "t:" + name;
}

//! The name in a tenant id ("t:NAME" → NAME; a key's hash stays itself).
inline std::string tenant_name(const std::string & id) {
    return id.rfind("t:", 0) == 0 ? id.substr(2) : id;
}

}  // namespace armada::common

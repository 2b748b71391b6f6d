#include "gateway/admin_api.h"

#include "api/errors.h"
#include "common/clock.h"
#include "gateway/replies.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace armada::gateway {

namespace {

using json = nlohmann::json;

const char * const kQuotaFields[] = {"requests_per_minute", "tokens_per_minute", "live_sessions", "kv_bytes"};

json tenant_json(const store::TenantRecord & t) {
    return {{"object", "tenant"},
            {"name", t.name},
            {"requests_per_minute", t.rpm},
            {"tokens_per_minute", t.tpm},
            {"live_sessions", t.live_sessions},
            {"kv_bytes", t.kv_bytes},
            {"created_at", t.created_ms / 1000},
            {"updated_at", t.updated_ms / 1000}};
}

json key_json(const store::KeyRecord & k) {
    return {{"object", "api_key"}, {"id", k.id},       {"tenant", k.tenant},
            {"prefix", k.prefix},  {"admin", k.admin}, {"created_at", k.created_ms / 1000}};
}

}  // namespace

void AdminApi::route(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                     const api::Caller & caller, const std::vector<std::string> & parts) {
    if (!caller.admin) return send_error(out, 403, "/admin needs an admin key", 0, "permission_denied");
    // Without an admin key of its own, the first key made here would lock everyone out.
    if (keys_.forward_key().empty())
        return send_error(out, 403,
                          "/admin needs the gateway to have an admin key of its own (--api-key or ARMADA_API_KEY)", 0,
                          "permission_denied");
    const std::string & m = req.method;
    if (parts.size() == 2 && parts[1] == "pools" && m == "GET")
        return out->send(200, "application/json",
                         json{{"object", "pools"}, {"pools", pools_ ? pools_->status(true) : json::object()}}.dump());
    if (parts.size() >= 2 && parts.size() <= 3 && parts[1] == "tenants") {
        if (parts.size() == 2 && m == "GET") {
            auto all = dir_.tenants();
            if (!all) return store_down(out);
            json data = json::array();
            for (const auto & t : *all)
                data.push_back(tenant_json(t));
            return out->send(200, "application/json", json{{"object", "list"}, {"data", data}}.dump());
        }
        if (parts.size() == 2 && m == "POST") return put_tenant(req, out, std::nullopt);
        if (parts.size() == 3 && (m == "PATCH" || m == "PUT")) return put_tenant(req, out, parts[2]);
        if (parts.size() == 3 && m == "GET") {
            auto all = dir_.tenants();
            if (!all) return store_down(out);
            for (const auto & t : *all) {
                if (t.name == parts[2]) return out->send(200, "application/json", tenant_json(t).dump());
            }
            return send_error(out, 404, "no tenant named '" + parts[2] + "'", 0, "not_found");
        }
        if (parts.size() == 3 && m == "DELETE") {
            auto r = dir_.delete_tenant(parts[2]);
            if (r == store::AdminResult::unavailable) return store_down(out);
            if (r == store::AdminResult::missing)
                return send_error(out, 404, "no tenant named '" + parts[2] + "'", 0, "not_found");
            keys_.load();
            spdlog::info("gateway: tenant '{}' deleted, with its keys", parts[2]);
            return out->send(200, "application/json",
                             json{{"object", "tenant"}, {"name", parts[2]}, {"deleted", true}}.dump());
        }
    }
    if (parts.size() >= 2 && parts.size() <= 3 && parts[1] == "keys") {
        if (parts.size() == 2 && m == "GET") {
            auto all = dir_.keys();
            if (!all) return store_down(out);
            const std::string only = req.param("tenant");
            json data = json::array();
            for (const auto & k : *all) {
                if (only.empty() || k.tenant == only) data.push_back(key_json(k));
            }
            return out->send(200, "application/json", json{{"object", "list"}, {"data", data}}.dump());
        }
        if (parts.size() == 2 && m == "POST") return create_key(req, out);
        if (parts.size() == 3 && m == "DELETE") {
            auto r = dir_.delete_key(parts[2]);
            if (r == store::AdminResult::unavailable) return store_down(out);
            if (r == store::AdminResult::missing)
                return send_error(out, 404, "no API key with id '" + parts[2] + "'", 0, "not_found");
            keys_.load();
            spdlog::info("gateway: API key {} deleted", parts[2]);
            return out->send(200, "application/json",
                             json{{"object", "api_key"}, {"id", parts[2]}, {"deleted", true}}.dump());
        }
    }
    send_error(out, 404,
               "no admin route " + m + " " + req.path +
                   "; there are /admin/tenants[/NAME] (GET, POST, PATCH, DELETE), /admin/keys[/ID] (GET, POST, "
                   "DELETE) and /admin/pools (GET)",
               0, "not_found");
}

void AdminApi::put_tenant(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                          const std::optional<std::string> & name) {
    const json body = json::parse(req.body.empty() ? std::string("{}") : req.body, nullptr, false);
    if (!body.is_object()) return send_error(out, 400, "the body must be a JSON object");
    store::TenantRecord t;
    if (name) {
        auto all = dir_.tenants();
        if (!all) return store_down(out);
        auto it = std::find_if(all->begin(), all->end(), [&](const auto & x) { return x.name == *name; });
        if (it == all->end()) return send_error(out, 404, "no tenant named '" + *name + "'", 0, "not_found");
        t = *it;
    }
    for (const auto & [k, v] : body.items()) {
        if (k == "name") {
            if (name) {
                if (v != *name) return send_error(out, 400, "a tenant's name cannot change");
                continue;
            }
            if (!v.is_string() || !api::valid_tenant_name(v.get<std::string>()))
                return send_error(out, 400, "'name' must be 1 to 64 letters, digits, '_', '-' or '.'", 0);
            t.name = v.get<std::string>();
            continue;
        }
        int64_t * field = k == kQuotaFields[0]   ? &t.rpm
                          : k == kQuotaFields[1] ? &t.tpm
                          : k == kQuotaFields[2] ? &t.live_sessions
                          : k == kQuotaFields[3] ? &t.kv_bytes
                                                 : nullptr;
        if (!field)
            return send_error(out, 400,
                              "unknown field '" + k +
                                  "'; a tenant has name, requests_per_minute, tokens_per_minute, live_sessions "
                                  "and kv_bytes");
        if (!v.is_number_integer() || v.get<int64_t>() < 0)
            return send_error(out, 400, "'" + k + "' must be a whole number, 0 or more (0 is unlimited)");
        *field = v.get<int64_t>();
    }
    if (t.name.empty()) return send_error(out, 400, "'name' is required");
    t.updated_ms = common::wall_ms();
    if (!name) t.created_ms = t.updated_ms;
    auto r = name ? dir_.update_tenant(t) : dir_.create_tenant(t);
    if (r == store::AdminResult::unavailable) return store_down(out);
    if (r == store::AdminResult::exists)
        return send_error(out, 409, "a tenant named '" + t.name + "' exists already", 0, "conflict");
    if (r == store::AdminResult::missing)
        return send_error(out, 404, "no tenant named '" + t.name + "'", 0, "not_found");
    keys_.load();
    spdlog::info("gateway: tenant '{}' {}: rpm {} tpm {} live sessions {} kv bytes {}", t.name,
                 name ? "updated" : "created", t.rpm, t.tpm, t.live_sessions, t.kv_bytes);
    out->send(name ? 200 : 201, "application/json", tenant_json(t).dump());
}

void AdminApi::create_key(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out) {
    const json body = json::parse(req.body.empty() ? std::string("{}") : req.body, nullptr, false);
    if (!body.is_object()) return send_error(out, 400, "the body must be a JSON object");
    store::KeyRecord k;
    for (const auto & [f, v] : body.items()) {
        if (f == "tenant" && v.is_string()) {
            k.tenant = v.get<std::string>();
        } else if (f == "admin" && v.is_boolean()) {
            k.admin = v.get<bool>();
        } else {
            return send_error(out, 400,
                              f == "tenant" || f == "admin"
                                  ? "'" + f + "' must be a " + (f == "admin" ? "boolean" : "string")
                                  : "unknown field '" + f + "'; a key has tenant and admin");
        }
    }
    if (k.tenant.empty()) return send_error(out, 400, "'tenant' is required");
    const std::string key = "sk-armada-" + random_hex(24);
    k.id = "key_" + random_hex(8);
    k.hash = key_hash(key);
    k.prefix = key.substr(0, 14);
    k.created_ms = common::wall_ms();
    auto r = dir_.create_key(k);
    if (r == store::AdminResult::unavailable) return store_down(out);
    if (r == store::AdminResult::missing)
        return send_error(out, 404, "no tenant named '" + k.tenant + "'; create it first", 0, "not_found");
    if (r != store::AdminResult::ok) return send_error(out, 500, "could not store the key; try again");
    keys_.load();
    spdlog::info("gateway: API key {} ({}…) created for tenant '{}'{}", k.id, k.prefix, k.tenant,
                 k.admin ? " (admin)" : "");
    json j = key_json(k);
    j["key"] = key;  // shown once: only its hash is kept
    out->send(201, "application/json", j.dump());
}

}  // namespace armada::gateway

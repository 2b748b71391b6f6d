#include "api/json_util.h"

#include "api/errors.h"
#include "common/json_fields.h"

namespace armada::api {

const char * error_type(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 429:
            return "rate_limit_error";
        case 500:
            return "server_error";
        case 503:
            return "service_unavailable_error";
        default:
            return "invalid_request_error";
    }
}

std::string error_body(int status, const std::string & message, const std::string & param, const std::string & code) {
    json e = {{"message", message},
              {"type", error_type(status)},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}};
    return dump(json{{"error", e}});
}

namespace {
struct TooDeep {};
}  // namespace

json parse_request_body(const std::string & body) {
    if (body.empty()) throw ApiError(400, "request body is empty; send a JSON object");
    json j;
    try {
        // The callback sees each nesting level as it opens, so a hostile 100k-deep body is
        // refused after kMaxJsonDepth levels instead of being built.
        j = json::parse(body, [](int depth, json::parse_event_t, json &) {
            if (depth > kMaxJsonDepth) throw TooDeep{};
            return true;
        });
    } catch (const TooDeep &) {
        throw ApiError(400, "JSON nesting exceeds " + std::to_string(kMaxJsonDepth) + " levels");
    } catch (const json::exception & e) {
        throw ApiError(400, std::string("invalid JSON body: ") + e.what());
    }
    if (!j.is_object()) throw ApiError(400, "request body must be a JSON object");
    return j;
}

std::string dump(const json & j) {
    return common::json_text(j);
}

std::string get_string(const json & j, const char * key, const std::string & def) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_string()) throw ApiError(400, std::string("'") + key + "' must be a string", key);
    return it->get<std::string>();
}

bool get_bool(const json & j, const char * key, bool def) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_boolean()) throw ApiError(400, std::string("'") + key + "' must be a boolean", key);
    return it->get<bool>();
}

double get_number(const json & j, const char * key, double def) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_number()) throw ApiError(400, std::string("'") + key + "' must be a number", key);
    return it->get<double>();
}

int64_t get_int(const json & j, const char * key, int64_t def) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_number_integer() && !it->is_number_unsigned()) {
        if (it->is_number_float() && it->get<double>() == double(int64_t(it->get<double>()))) {
            return int64_t(it->get<double>());
        }
        throw ApiError(400, std::string("'") + key + "' must be an integer", key);
    }
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)) {
        throw ApiError(400, std::string("'") + key + "' is out of range", key);
    }
    return it->get<int64_t>();
}

}  // namespace armada::api

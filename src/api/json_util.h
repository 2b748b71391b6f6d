#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace armada::api {

using json = nlohmann::json;

//! Deepest nesting a request body may have.
inline constexpr int kMaxJsonDepth = 64;

//! Parses a request body. Throws ApiError(400) for malformed JSON, too-deep nesting or a
//! top level that is not an object.
json parse_request_body(const std::string & body);

//! Serialises with invalid UTF-8 replaced (model output and client strings may hold any bytes).
std::string dump(const json & j);

//! Typed field readers that throw ApiError(400) naming the field on a type mismatch.
//! A missing or null field yields `def`.
std::string get_string(const json & j, const char * key, const std::string & def = {});
bool get_bool(const json & j, const char * key, bool def);
double get_number(const json & j, const char * key, double def);
int64_t get_int(const json & j, const char * key, int64_t def);

}  // namespace armada::api

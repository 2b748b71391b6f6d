#pragma once

// Typed reads of one field of a JSON object, for replies and messages from outside (etcd,
// Kubernetes, NATS, clients): a value that is not an object, a field that is missing, and a field
// of another type all read as none, and nothing throws. Numbers that etcd sends as strings are
// its adapter's business, not these.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace armada::common {

//! `j` as compact JSON text; invalid UTF-8 in its strings becomes U+FFFD instead of throwing.
inline std::string json_text(const nlohmann::json & j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

//! `j[key]` when `j` is an object that holds `key`; else null.
inline const nlohmann::json * field(const nlohmann::json & j, const std::string & key) {
    if (!j.is_object()) return nullptr;
    const auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
}

inline std::optional<std::string> string_field(const nlohmann::json & j, const std::string & key) {
    const auto * f = field(j, key);
    if (!f || !f->is_string()) return std::nullopt;
    return f->get<std::string>();
}

//! An integer (a number with a fraction, or a string, is none).
inline std::optional<int64_t> int_field(const nlohmann::json & j, const std::string & key) {
    const auto * f = field(j, key);
    if (!f || !f->is_number_integer()) return std::nullopt;
    return f->get<int64_t>();
}

//! A non-negative integer.
inline std::optional<uint64_t> uint_field(const nlohmann::json & j, const std::string & key) {
    const auto * f = field(j, key);
    if (!f || !f->is_number_unsigned()) return std::nullopt;
    return f->get<uint64_t>();
}

inline std::optional<bool> bool_field(const nlohmann::json & j, const std::string & key) {
    const auto * f = field(j, key);
    if (!f || !f->is_boolean()) return std::nullopt;
    return f->get<bool>();
}

//! The field when it is an object (or an array); else null.
inline const nlohmann::json * object_field(const nlohmann::json & j, const std::string & key) {
    const auto * f = field(j, key);
    return f && f->is_object() ? f : nullptr;
}
inline const nlohmann::json * array_field(const nlohmann::json & j, const std::string & key) {
    const auto * f = field(j, key);
    return f && f->is_array() ? f : nullptr;
}

//! The object reached through `path`, each step an object's field (`{"metadata", "labels"}`);
//! null when a step is missing or not an object. An empty path gives `j` if it is an object.
inline const nlohmann::json * object_at(const nlohmann::json & j, std::initializer_list<const char *> path) {
    const nlohmann::json * at = j.is_object() ? &j : nullptr;
    for (const char * key : path) {
        if (!at) return nullptr;
        at = object_field(*at, key);
    }
    return at;
}

}  // namespace armada::common

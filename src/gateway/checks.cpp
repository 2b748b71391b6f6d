#include "gateway/checks.h"

#include "agent/event_stream.h"

#include <vector>

namespace armada::gateway {

namespace {

bool alnum(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

//! Well-formed UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF).
bool utf8_ok(std::string_view s) {
    const auto * p = reinterpret_cast<const unsigned char *>(s.data());
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        const unsigned char c = p[i];
        if (c < 0x80) {
            ++i;
            continue;
        }
        size_t len = 0;
        unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else {
            return false;
        }
        if (i + len > n) return false;
        if (p[i + 1] < lo || p[i + 1] > hi) return false;
        for (size_t k = 2; k < len; ++k) {
            if (p[i + k] < 0x80 || p[i + k] > 0xbf) return false;
        }
        i += len;
    }
    return true;
}

bool is_json_type(const std::string & ct) {
    // application/json, with or without parameters; an empty type is read as JSON by the node.
    if (ct.empty()) return true;
    std::string t;
    for (char c : ct) {
        if (c == ';') break;
        if (c != ' ' && c != '\t') t += char(std::tolower(static_cast<unsigned char>(c)));
    }
    return t == "application/json" || (t.size() > 5 && t.compare(t.size() - 5, 5, "+json") == 0);
}

}  // namespace

bool id_ok(std::string_view id) {
    if (id.empty() || id.size() > 128) return false;
    for (unsigned char c : id) {
        if (!alnum(c) && c != '_' && c != '-') return false;
    }
    return true;
}

bool segment_ok(std::string_view s) {
    if (s.empty() || s.size() > 200) return false;
    for (unsigned char c : s) {
        if (!alnum(c) && c != '_' && c != '-' && c != '.' && c != '~' && c != ':' && c != '@') return false;
    }
    return true;
}

std::optional<std::string> body_problem(std::string_view body, const BodyLimits & limits, bool utf8) {
    if (utf8 && !utf8_ok(body)) return "the body is not valid UTF-8";
    std::vector<char> open;  // '{' or '[' for each level
    open.reserve(size_t(limits.max_depth) + 1);
    size_t values = 0;
    bool in_string = false, is_key = false, expect_key = false;
    size_t len = 0;
    for (size_t i = 0; i < body.size(); ++i) {
        const char c = body[i];
        if (in_string) {
            if (c == '\\') {
                ++i;  // the escaped byte (a \uXXXX's digits count as plain bytes below)
                ++len;
            } else if (c == '"') {
                in_string = false;
                if (is_key && len > limits.max_key_bytes)
                    return "an object member's name is longer than " + std::to_string(limits.max_key_bytes) + " bytes";
                continue;
            } else {
                ++len;
            }
            if (len > limits.max_string_bytes)
                return "a string is longer than " + std::to_string(limits.max_string_bytes) + " bytes";
            continue;
        }
        switch (c) {
            case '"':
                in_string = true;
                is_key = expect_key;
                expect_key = false;
                len = 0;
                break;
            case '{':
            case '[':
                if (int(open.size()) >= limits.max_depth)
                    return "JSON nesting exceeds " + std::to_string(limits.max_depth) + " levels";
                open.push_back(c);
                expect_key = c == '{';
                ++values;
                break;
            case '}':
            case ']':
                if (!open.empty()) open.pop_back();
                expect_key = false;
                break;
            case ',':
                expect_key = !open.empty() && open.back() == '{';
                ++values;
                break;
            default:
                break;
        }
        if (values > limits.max_values)
            return "the body holds more than " + std::to_string(limits.max_values) + " values";
    }
    return std::nullopt;
}

std::optional<Refusal> check_request(const api::HttpRequest & req, const BodyLimits & limits) {
    if (!header_name_ok(req.method)) return Refusal{400, "the request method is not a valid token"};
    const std::string target = target_of(req);
    if (!target_ok(target))
        return Refusal{400, "the request target must be visible ASCII starting with '/', at most 8 KiB"};
    for (const auto & [k, v] : req.headers) {
        if (!header_name_ok(k)) return Refusal{400, "a header name is not a valid token"};
        if (!header_value_ok(v))
            return Refusal{400, "header '" + k + "' holds a control character or is longer than 16 KiB"};
    }
    // Ids in the path, each against its own grammar.
    const std::vector<std::string> parts = split_path(req.path);
    if (parts.size() >= 3 && parts[0] == "v1" && (parts[1] == "sessions" || parts[1] == "responses")) {
        if (!id_ok(parts[2]))
            return Refusal{400, std::string(parts[1] == "sessions" ? "a session" : "a response") +
                                    " id is 1 to 128 letters, digits, '_' or '-'"};
    }
    for (size_t i = 1; i < parts.size(); ++i) {
        if (!segment_ok(parts[i])) return Refusal{400, "a path segment is 1 to 200 letters, digits or any of ._~:@-"};
    }
    // A value from the query string that becomes a header, and the header itself.
    for (const std::string & last : {req.header("last-event-id"), req.param("last_event_id")}) {
        if (!last.empty() && !agent::EventId::parse(last))
            return Refusal{400, "Last-Event-ID must be an event id such as 12 or 12.3"};
    }
    const bool agents = parts.size() >= 2 && parts[0] == "v1" && parts[1] == "agents";
    if (!req.body.empty() && (agents || is_json_type(req.header("content-type")))) {
        if (auto why = body_problem(req.body, limits, !agents)) return Refusal{400, *why};
    }
    return std::nullopt;
}

HeaderPairs pass_headers(const api::HttpRequest & req) {
    HeaderPairs h;
    for (const auto & [k, v] : req.headers) {
        if (k == "host" || k == "connection" || k == "content-length" || k == "transfer-encoding" ||
            k == "keep-alive" || k == "te" || k == "upgrade" || k == "last-event-id" || k == "proxy-connection" ||
            k == "trailer" || k == "expect")
            continue;
        if (!header_name_ok(k) || !header_value_ok(v)) continue;
        h.emplace_back(k, v);
    }
    return h;
}

std::vector<std::string> split_path(const std::string & path) {
    std::vector<std::string> parts;
    size_t i = 1;
    while (i <= path.size()) {
        size_t j = path.find('/', i);
        if (j == std::string::npos) j = path.size();
        if (j > i) parts.push_back(path.substr(i, j - i));
        i = j + 1;
    }
    return parts;
}

std::string target_of(const api::HttpRequest & req) {
    return req.query.empty() ? req.path : req.path + "?" + req.query;
}

}  // namespace armada::gateway

#pragma once

// What the gateway checks in a client's request before any of it goes further: the bytes that
// become a node's request line and headers, the ids in a path, and a JSON body's shape. The
// gateway is a hostile-input boundary (docs/SECURITY.md): a value passes on only once it has
// been checked here.

#include "api/http_server.h"
#include "net/http_syntax.h"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace armada::gateway {

// Header names and values, and request targets: the outgoing client's rules (net/http_syntax.h).
using armada::net::header_name_ok;
using armada::net::header_value_ok;
using armada::net::target_ok;

//! A session or response id: 1 to 128 letters, digits, '_' or '-' (the ids Armada makes are
//! `sess_` and `resp_` followed by letters and digits).
bool id_ok(std::string_view id);
//! A path segment of any other kind (agent and tenant names, key ids): 1 to 200 bytes of
//! letters, digits and `._~:@-`.
bool segment_ok(std::string_view segment);

//! Limits on a JSON body, as a node applies them (api/json_util.h), checked by one pass over
//! the bytes before anything parses or builds the body.
struct BodyLimits {
    int max_depth = 64;                  // nesting of objects and arrays
    size_t max_values = 200000;          // values of every kind (members and elements), in all
    size_t max_key_bytes = 4096;         // an object member's name
    size_t max_string_bytes = 8u << 20;  // any string
};

//! Why `body` breaks a limit, or nullopt. It checks UTF-8 (RFC 8259 text is UTF-8; not with
//! `utf8` false), nesting, counts and lengths without building anything; a body that passes may
//! still be invalid JSON, which the parser that reads it reports.
std::optional<std::string> body_problem(std::string_view body, const BodyLimits & limits = {}, bool utf8 = true);

//! A refusal of a client's request: a status and the reason the client reads.
struct Refusal {
    int status = 400;
    std::string reason;
};

//! Everything the gateway checks on a request before routing it: the method, the target, every
//! header, the ids in the path, the query values that become headers (last_event_id), and a body
//! sent as JSON. Agent declarations (`/v1/agents`) may be YAML, whose bytes a node repairs
//! (invalid UTF-8 becomes U+FFFD): their nesting and size are checked, not their encoding.
//! nullopt: it may go on.
std::optional<Refusal> check_request(const api::HttpRequest & req, const BodyLimits & limits = {});

//! The client's headers that go on to a node: hop-by-hop ones (and Last-Event-ID, which the
//! event relay sets itself) left out, and any header whose name or value is not clean dropped.
using HeaderPairs = std::vector<std::pair<std::string, std::string>>;
HeaderPairs pass_headers(const api::HttpRequest & req);

//! A path's non-empty segments ("/v1//sessions/x" → v1, sessions, x).
std::vector<std::string> split_path(const std::string & path);

//! The request target a node gets: the path, and the query string as the client sent it.
std::string target_of(const api::HttpRequest & req);

}  // namespace armada::gateway

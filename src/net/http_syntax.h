#pragma once

// The bytes an outgoing request may carry on its request line and in its headers. The HTTP
// client (net/http_client.h) writes nothing that fails these, so one request handed to it is at
// most one request on the wire; the gateway checks clients' headers with the same rules.

#include <string_view>

namespace armada::net {

//! A header name or a method: an RFC 9110 token (letters, digits and !#$%&'*+-.^_`|~), 1 to 256
//! bytes.
bool header_name_ok(std::string_view name);
//! A header value: no CR, LF, NUL or other control byte (a tab is allowed), at most 16 KiB.
bool header_value_ok(std::string_view value);
//! A request target as written on the request line: visible ASCII only (no space, no control
//! byte, nothing above 0x7e), starting with '/', at most 8 KiB.
bool target_ok(std::string_view target);

}  // namespace armada::net

#pragma once

#include <cctype>
#include <cstdio>
#include <string>

namespace armada::common {

//! Percent-encodes every byte of `s` but RFC 3986's unreserved ones (and '/', when `keep_slash`):
//! a value or path segment from anyone cannot change the URL it is put in.
inline std::string percent_encode(const std::string & s, bool keep_slash = false) {
    std::string out;
    for (const unsigned char c : s) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
            out += char(c);
        } else {
            char b[4];
            std::snprintf(b, sizeof b, "%%%02X", c);
            out += b;
        }
    }
    return out;
}

}  // namespace armada::common

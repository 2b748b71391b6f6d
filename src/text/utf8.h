#pragma once

#include <string>
#include <string_view>

// The bottom room: text helpers that every other room may include, and that include nothing of
// Armada's own.
namespace armada::text {

//! Number of bytes at the end of `s` that begin a UTF-8 character not yet complete (0..3).
size_t utf8_incomplete_tail(std::string_view s);

//! Copy of `s` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);

}  // namespace armada::text

#pragma once

#include <string>

namespace armada::tools {

//! The charset named in a Content-Type header value, lower-cased; "" when none is given.
std::string charset_of(const std::string & content_type);

//! Converts `body` from `charset` (GBK, GB18030, Latin-1, … anything iconv knows) to UTF-8.
//! Bytes that do not decode become U+FFFD; an unknown charset is treated as UTF-8. The result
//! is always valid UTF-8, so tool output never turns into mojibake or breaks the context.
std::string to_utf8(const std::string & body, const std::string & charset);

}  // namespace armada::tools

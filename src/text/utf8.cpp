#include "text/utf8.h"

#include <algorithm>

namespace armada::text {

namespace {
// Length of a UTF-8 sequence from its lead byte; 0 for a continuation or invalid lead.
size_t seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return c >= 0xC2 ? 2 : 0;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return c <= 0xF4 ? 4 : 0;
    return 0;
}
}  // namespace

size_t utf8_incomplete_tail(std::string_view s) {
    // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
    for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
        const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte, keep looking
        const size_t need = seq_len(c);
        return need > back ? back : 0;
    }
    return 0;
}

std::string utf8_sanitize(std::string_view s) {
    static const char kReplacement[] = "\xEF\xBF\xBD";
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        size_t n = seq_len(c);
        bool ok = n > 0 && i + n <= s.size();
        for (size_t k = 1; ok && k < n; ++k)
            ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
        if (ok && n == 3) {
            const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);  // overlong, surrogates
        } else if (ok && n == 4) {
            const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
            ok = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
        }
        if (ok) {
            out.append(s.substr(i, n));
            i += n;
        } else {
            out += kReplacement;
            i += 1;
        }
    }
    return out;
}

}  // namespace armada::text

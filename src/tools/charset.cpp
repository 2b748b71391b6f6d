#include "tools/charset.h"

#include "text/utf8.h"

#include <iconv.h>

#include <algorithm>
#include <cerrno>

namespace armada::tools {

std::string charset_of(const std::string & content_type) {
    std::string ct = content_type;
    std::transform(ct.begin(), ct.end(), ct.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    const auto p = ct.find("charset=");
    if (p == std::string::npos) return {};
    std::string v = ct.substr(p + 8);
    v = v.substr(0, v.find_first_of("; \t"));
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    return v;
}

std::string to_utf8(const std::string & body, const std::string & charset) {
    if (charset.empty() || charset == "utf-8" || charset == "utf8" || charset == "us-ascii") {
        return text::utf8_sanitize(body);
    }
    iconv_t cd = iconv_open("UTF-8", charset.c_str());
    if (cd == iconv_t(-1)) {  // NOLINT(performance-no-int-to-ptr): iconv's documented failure value
        return text::utf8_sanitize(body);
    }
    std::string out;
    out.reserve(body.size() * 2);
    char * in = const_cast<char *>(body.data());
    size_t in_left = body.size();
    char buf[4096];
    while (in_left > 0) {
        char * o = buf;
        size_t o_left = sizeof(buf);
        const size_t rc = iconv(cd, &in, &in_left, &o, &o_left);
        out.append(buf, sizeof(buf) - o_left);
        if (rc == size_t(-1)) {
            if (errno == E2BIG) continue;
            // EILSEQ or a truncated tail (EINVAL): one replacement character, skip a byte.
            out += "\xEF\xBF\xBD";
            ++in;
            --in_left;
            iconv(cd, nullptr, nullptr, nullptr, nullptr);
        }
    }
    iconv_close(cd);
    return text::utf8_sanitize(out);
}

}  // namespace armada::tools

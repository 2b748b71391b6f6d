#include "net/http_syntax.h"

namespace armada::net {

namespace {

bool is_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    switch (c) {
        case '!':
        case '#':
        case '$':
        case '%':
        case '&':
        case '\'':
        case '*':
        case '+':
        case '-':
        case '.':
        case '^':
        case '_':
        case '`':
        case '|':
        case '~':
            return true;
        default:
            return false;
    }
}

}  // namespace

bool header_name_ok(std::string_view name) {
    if (name.empty() || name.size() > 256) return false;
    for (unsigned char c : name) {
        if (!is_tchar(c)) return false;
    }
    return true;
}

bool header_value_ok(std::string_view value) {
    if (value.size() > 16 * 1024) return false;
    for (unsigned char c : value) {
        if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
    }
    return true;
}

bool target_ok(std::string_view target) {
    if (target.empty() || target.size() > 8 * 1024 || target[0] != '/') return false;
    for (unsigned char c : target) {
        if (c <= 0x20 || c >= 0x7f) return false;
    }
    return true;
}

}  // namespace armada::net

#include "tools/ssrf.h"

namespace armada::tools {

namespace ip = boost::asio::ip;

namespace {
ip::address normalise(const ip::address & a) {
    if (a.is_v6() && a.to_v6().is_v4_mapped()) return ip::make_address_v4(ip::v4_mapped, a.to_v6());
    return a;
}

bool in_range(const ip::address & a, const Cidr & c) {
    const ip::address x = normalise(a), b = normalise(c.base);
    if (x.is_v4() != b.is_v4()) return false;
    if (x.is_v4()) {
        const uint32_t mask = c.prefix == 0 ? 0 : ~uint32_t(0) << (32 - c.prefix);
        return (x.to_v4().to_uint() & mask) == (b.to_v4().to_uint() & mask);
    }
    const auto xb = x.to_v6().to_bytes(), bb = b.to_v6().to_bytes();
    int bits = c.prefix;
    for (size_t i = 0; i < 16 && bits > 0; ++i, bits -= 8) {
        const uint8_t mask = bits >= 8 ? 0xff : uint8_t(0xff << (8 - bits));
        if ((xb[i] & mask) != (bb[i] & mask)) return false;
    }
    return true;
}

const char * denied_kind(const ip::address & raw) {
    const ip::address a = normalise(raw);
    if (a.is_unspecified()) return "unspecified";
    if (a.is_loopback()) return "loopback";
    if (a.is_multicast()) return "multicast";
    if (a.is_v4()) {
        const uint32_t v = a.to_v4().to_uint();
        auto in = [&](uint32_t base, int prefix) { return (v >> (32 - prefix)) == (base >> (32 - prefix)); };
        if (in(0x00000000, 8)) return "unspecified";
        if (in(0x7f000000, 8)) return "loopback";
        if (in(0x0a000000, 8) || in(0xac100000, 12) || in(0xc0a80000, 16)) return "private";
        if (in(0xa9fe0000, 16)) return "link-local or metadata";
        if (in(0x64400000, 10)) return "shared (CGNAT)";
        if (in(0xc0000000, 24) || in(0xc6120000, 15)) return "reserved";
        if (v >= 0xf0000000) return "reserved";
        return nullptr;
    }
    const auto b = a.to_v6().to_bytes();
    if ((b[0] & 0xfe) == 0xfc) return "private (ULA)";
    if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return "link-local";
    return nullptr;
}
}  // namespace

bool parse_cidr(const std::string & text, Cidr & out) {
    const auto slash = text.find('/');
    boost::system::error_code ec;
    out.base = ip::make_address(text.substr(0, slash), ec);
    if (ec) return false;
    const int max = out.base.is_v4() ? 32 : 128;
    out.prefix = max;
    if (slash != std::string::npos) {
        try {
            size_t used = 0;
            out.prefix = std::stoi(text.substr(slash + 1), &used);
            if (used != text.size() - slash - 1) return false;
        } catch (...) {
            return false;
        }
        if (out.prefix < 0 || out.prefix > max) return false;
    }
    return true;
}

std::string SsrfGuard::reason(const ip::address & a) const {
    const char * kind = denied_kind(a);
    if (!kind) return {};
    for (const auto & c : allow_) {
        if (in_range(a, c)) return {};
    }
    return std::string("address ") + normalise(a).to_string() + " is " + kind + " and not allow-listed";
}

bool SsrfGuard::permitted(const ip::address & a) const {
    return reason(a).empty();
}

}  // namespace armada::tools

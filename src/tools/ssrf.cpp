#include "tools/ssrf.h"

#include <algorithm>

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
    if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return "site-local";
    if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8) return "reserved (documentation)";
    return nullptr;
}

ip::address_v4 v4_at(const ip::address_v6::bytes_type & b, size_t at, bool inverted = false) {
    ip::address_v4::bytes_type v{};
    for (size_t i = 0; i < 4; ++i)
        v[i] = inverted ? uint8_t(~b[at + i]) : b[at + i];
    return ip::address_v4(v);
}

//! IPv4 addresses an IPv6 address carries inside, and the form that carries them: a host that
//! routes the form (a NAT64 gateway, a 6to4 or Teredo relay, an old dual stack) reaches them.
std::vector<std::pair<ip::address_v4, const char *>> embedded_v4(const ip::address_v6 & a) {
    const auto b = a.to_bytes();
    auto zero = [&](size_t from, size_t to) {
        for (size_t i = from; i < to; ++i) {
            if (b[i] != 0) return false;
        }
        return true;
    };
    // 64:ff9b::/96 (NAT64, RFC 6052) and 64:ff9b:1::/48 (local-use NAT64, RFC 8215).
    if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b) {
        if (zero(4, 12)) return {{v4_at(b, 12), "NAT64"}};
        if (b[4] == 0x00 && b[5] == 0x01) return {{v4_at(b, 12), "local-use NAT64"}};
    }
    if (b[0] == 0x20 && b[1] == 0x02) return {{v4_at(b, 2), "6to4"}};  // 2002::/16
    // Teredo 2001::/32: the server's address, and the client's, stored inverted.
    if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x00 && b[3] == 0x00)
        return {{v4_at(b, 4), "Teredo server"}, {v4_at(b, 12, true), "Teredo client"}};
    // ::a.b.c.d (IPv4-compatible, deprecated); :: and ::1 are judged as themselves.
    if (zero(0, 12) && !(zero(12, 15) && b[15] <= 1)) return {{v4_at(b, 12), "IPv4-compatible"}};
    return {};
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
    auto allowed = [&](const ip::address & x) {
        return std::any_of(allow_.begin(), allow_.end(), [&](const Cidr & c) { return in_range(x, c); });
    };
    const ip::address n = normalise(a);
    if (n.is_v6() && !allowed(n)) {
        for (const auto & [v4, form] : embedded_v4(n.to_v6())) {
            const char * kind = denied_kind(v4);
            if (kind && !allowed(v4)) {
                return "address " + n.to_string() + " carries " + v4.to_string() + " inside (" + form + "), which is " +
                       kind + ", and is not allow-listed";
            }
        }
    }
    const char * kind = denied_kind(a);
    if (!kind || allowed(a)) return {};
    return std::string("address ") + n.to_string() + " is " + kind + " and not allow-listed";
}

bool SsrfGuard::permitted(const ip::address & a) const {
    return reason(a).empty();
}

}  // namespace armada::tools

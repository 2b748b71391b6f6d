#include "tools/charset.h"
#include "tools/ssrf.h"

#include <gtest/gtest.h>

using namespace armada::tools;
namespace ip = boost::asio::ip;

TEST(Ssrf, DeniesInternalRanges) {
    SsrfGuard g;
    for (const char * a :
         {"127.0.0.1", "127.9.9.9", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "169.254.169.254",
          "0.0.0.0", "100.64.0.1", "::1", "fd00::1", "fe80::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "224.0.0.1"}) {
        EXPECT_FALSE(g.permitted(ip::make_address(a))) << a;
    }
    for (const char * a : {"8.8.8.8", "172.32.0.1", "1.1.1.1", "2606:4700::1111"}) {
        EXPECT_TRUE(g.permitted(ip::make_address(a))) << a;
    }
}

TEST(Ssrf, AllowListOpensARange) {
    SsrfGuard g;
    Cidr c;
    ASSERT_TRUE(parse_cidr("127.0.0.1", c));
    g.allow(c);
    EXPECT_TRUE(g.permitted(ip::make_address("127.0.0.1")));
    EXPECT_TRUE(g.permitted(ip::make_address("::ffff:127.0.0.1")));
    EXPECT_FALSE(g.permitted(ip::make_address("127.0.0.2")));
    EXPECT_FALSE(g.permitted(ip::make_address("10.0.0.1")));
    ASSERT_TRUE(parse_cidr("10.0.0.0/8", c));
    g.allow(c);
    EXPECT_TRUE(g.permitted(ip::make_address("10.200.0.1")));
    EXPECT_FALSE(parse_cidr("10.0.0.0/33", c));
    EXPECT_FALSE(parse_cidr("nonsense", c));
}

TEST(Charset, ParsesContentType) {
    EXPECT_EQ(charset_of("text/plain; charset=GBK"), "gbk");
    EXPECT_EQ(charset_of("application/json;charset=\"utf-8\""), "utf-8");
    EXPECT_EQ(charset_of("application/json"), "");
}

TEST(Charset, GbkAndGb18030BecomeUtf8) {
    const std::string gbk = "\xC4\xE3\xBA\xC3";  // 你好 in GBK
    EXPECT_EQ(to_utf8(gbk, "gbk"), "\xE4\xBD\xA0\xE5\xA5\xBD");
    EXPECT_EQ(to_utf8(gbk, "gb18030"), "\xE4\xBD\xA0\xE5\xA5\xBD");
}

TEST(Charset, InvalidBytesAreReplaced) {
    EXPECT_EQ(to_utf8("a\xFF"
                      "b",
                      "utf-8"),
              "a\xEF\xBF\xBD"
              "b");
    EXPECT_EQ(to_utf8("\xC4\xE3\xBA", "gbk"), "\xE4\xBD\xA0\xEF\xBF\xBD");  // truncated second character
    EXPECT_EQ(to_utf8("ok", "no-such-charset"), "ok");
}

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace {
// Resolves like the tool transport does, then asks the guard about every address.
bool any_permitted(const SsrfGuard & g, const std::string & host) {
    boost::asio::io_context io;
    boost::asio::ip::tcp::resolver r(io);
    boost::system::error_code ec;
    auto results = r.resolve(host, "80", ec);
    EXPECT_FALSE(ec) << host << ": " << ec.message();
    bool any = false;
    for (const auto & e : results)
        any |= g.permitted(e.endpoint().address());
    return any;
}
}  // namespace

TEST(Ssrf, NumericFormsAndNamesAreJudgedAfterResolution) {
    SsrfGuard g;
    // decimal, hex, octal and short forms of 127.0.0.1, a name for it, and metadata in decimal
    for (const char * h : {"2130706433", "0x7f000001", "017700000001", "127.1", "localhost", "2852039166"}) {
        EXPECT_FALSE(any_permitted(g, h)) << h;
    }
}

TEST(Ssrf, Ipv6FormsThatCarryAnIpv4AddressAreJudgedByIt) {
    SsrfGuard g;
    struct Case {
        const char * addr;
        bool permitted;
        const char * says;
    };
    const Case cases[] = {
        // NAT64 (64:ff9b::/96) and local-use NAT64 (64:ff9b:1::/48)
        {"64:ff9b::7f00:1", false, "carries 127.0.0.1 inside (NAT64), which is loopback"},
        {"64:ff9b::a9fe:a9fe", false, "carries 169.254.169.254 inside (NAT64)"},
        {"64:ff9b:1::c0a8:101", false, "carries 192.168.1.1 inside (local-use NAT64)"},
        {"64:ff9b::808:808", true, ""},
        // 6to4 (2002::/16): the address is in bits 16..47
        {"2002:0a00:0001::1", false, "carries 10.0.0.1 inside (6to4), which is private"},
        {"2002:7f00:0001::", false, "carries 127.0.0.1 inside (6to4)"},
        {"2002:0808:0808::1", true, ""},
        // IPv4-compatible (::/96, deprecated)
        {"::127.0.0.1", false, "carries 127.0.0.1 inside (IPv4-compatible)"},
        {"::10.1.2.3", false, "carries 10.1.2.3 inside (IPv4-compatible)"},
        {"::8.8.8.8", true, ""},
        // Teredo (2001::/32): the server in bits 32..63, the client inverted in the last 32
        {"2001:0:7f00:1::", false, "carries 127.0.0.1 inside (Teredo server)"},
        {"2001:0:808:808::f5ff:fffe", false, "carries 10.0.0.1 inside (Teredo client), which is private"},
        {"2001:0:808:808::f7f7:f7f7", true, ""},
        // site-local (fec0::/10, deprecated)
        {"fec0::1", false, "is site-local"},
        {"feff::1", false, "is site-local"},
    };
    for (const auto & c : cases) {
        const auto a = ip::make_address(c.addr);
        EXPECT_EQ(g.permitted(a), c.permitted) << c.addr << ": " << g.reason(a);
        if (!c.permitted) EXPECT_NE(g.reason(a).find(c.says), std::string::npos) << c.addr << ": " << g.reason(a);
    }
    // :: and ::1 stay what they are.
    EXPECT_NE(g.reason(ip::make_address("::1")).find("loopback"), std::string::npos);
    EXPECT_NE(g.reason(ip::make_address("::")).find("unspecified"), std::string::npos);
    // Allowing the IPv4 range allows it in every form.
    Cidr c;
    ASSERT_TRUE(parse_cidr("10.0.0.0/8", c));
    g.allow(c);
    EXPECT_TRUE(g.permitted(ip::make_address("64:ff9b::a00:1")));
    EXPECT_TRUE(g.permitted(ip::make_address("2002:0a00:0001::1")));
    EXPECT_FALSE(g.permitted(ip::make_address("64:ff9b::7f00:1")));
}

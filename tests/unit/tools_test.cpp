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

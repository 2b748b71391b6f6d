// The rules a tool or MCP call follows across redirects (net/url.h, net/http_client.h,
// tools/http_tool.h).
#include "net/http_client.h"
#include "net/url.h"
#include "tools/http_tool.h"

#include <gtest/gtest.h>

using namespace armada::net;
using namespace armada::tools;

namespace {
Url url(const std::string & s) {
    Url u;
    EXPECT_TRUE(parse_url(s, u)) << s;
    return u;
}
}  // namespace

TEST(Redirect, OriginIsSchemeHostAndPort) {
    EXPECT_TRUE(same_origin(url("http://a.example/x"), url("http://A.example:80/y?z")));
    EXPECT_FALSE(same_origin(url("http://a.example/x"), url("https://a.example/x")));
    EXPECT_FALSE(same_origin(url("http://a.example/x"), url("http://a.example:8080/x")));
    EXPECT_FALSE(same_origin(url("http://a.example/x"), url("http://b.example/x")));
    EXPECT_FALSE(same_origin(url("http://a.example/x"), url("http://a.example.evil/x")));
}

TEST(Redirect, LocationIsResolvedAgainstTheRequest) {
    const Url base = url("http://127.0.0.1:9000/api/v1/tool?q=1");
    EXPECT_EQ(resolve_location(base, "/other"), "http://127.0.0.1:9000/other");
    EXPECT_EQ(resolve_location(base, "next"), "http://127.0.0.1:9000/api/v1/next");
    EXPECT_EQ(resolve_location(base, "https://x.example/y"), "https://x.example/y");
    EXPECT_EQ(resolve_location(base, "//x.example/y"), "http://x.example/y");
    EXPECT_EQ(resolve_location(url("http://[::1]:81/a"), "/b"), "http://[::1]:81/b");
}

TEST(Redirect, CredentialsAndTheSpecsHeadersStayBehindAcrossOrigins) {
    const auto sensitive = names_of({{"X-Token", "a"}, {"X-Tenant", "b"}});
    for (const char * h : {"Authorization", "authorization", "Cookie", "Proxy-Authorization", "x-token", "X-TENANT"})
        EXPECT_TRUE(dropped_across_origins(h, sensitive)) << h;
    for (const char * h : {"Idempotency-Key", "Content-Type", "Accept"})
        EXPECT_FALSE(dropped_across_origins(h, sensitive)) << h;
}

TEST(SecretReferences, ExpandOnlyWhatTheOperatorWrote) {
    std::string out, err;
    setenv("ARMADA_UNIT_SECRET", "v42", 1);
    ASSERT_TRUE(resolve_secret("Bearer ${env:ARMADA_UNIT_SECRET}", out, err)) << err;
    EXPECT_EQ(out, "Bearer v42");
    EXPECT_FALSE(resolve_secret("${env:ARMADA_NO_SUCH_VARIABLE}", out, err));
    EXPECT_EQ(err.find("v42"), std::string::npos);
}

#include "api/auth.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

using namespace armada::api;

TEST(Auth, ConstantTimeEqual) {
    EXPECT_TRUE(constant_time_equal("abc", "abc"));
    EXPECT_FALSE(constant_time_equal("abc", "abd"));
    EXPECT_FALSE(constant_time_equal("abc", "abcd"));
    EXPECT_FALSE(constant_time_equal("", "a"));
}

TEST(Auth, BearerAndHeader) {
    ApiKeys k;
    EXPECT_FALSE(k.enabled());
    k.add("sk-1");
    ASSERT_NE(k.check("Bearer sk-1", ""), nullptr);
    EXPECT_EQ(k.check("Bearer sk-1", "")->key, "sk-1");
    EXPECT_EQ(k.check("", "sk-1")->key, "sk-1");
    EXPECT_EQ(k.check("Bearer sk-2", ""), nullptr);
    EXPECT_EQ(k.check("Basic sk-1", ""), nullptr);
    EXPECT_EQ(k.check("", ""), nullptr);
}

TEST(Auth, KeyFile) {
    const std::string path = testing::TempDir() + "/keys.txt";
    std::ofstream(path) << "# comment\nsk-a\n\nsk-b\r\n";
    ApiKeys k;
    EXPECT_EQ(k.load_file(path), "");
    ASSERT_NE(k.check("Bearer sk-b", ""), nullptr);
    EXPECT_EQ(k.check("Bearer sk-b", "")->key, "sk-b");
    EXPECT_NE(k.load_file("/nonexistent/keys"), "");
}

TEST(Auth, KeysBelongToTenants) {
    const std::string path = testing::TempDir() + "/tenant-keys.txt";
    std::ofstream(path) << "sk-a1 tenant=acme rpm=60\nsk-a2 tenant=acme admin\nsk-solo\nsk-b tenant=beta tpm=1000\n";
    ApiKeys k;
    ASSERT_EQ(k.load_file(path), "");
    const Caller a1 = k.caller(k.check("Bearer sk-a1", "")), a2 = k.caller(k.check("Bearer sk-a2", ""));
    const Caller solo = k.caller(k.check("Bearer sk-solo", "")), b = k.caller(k.check("Bearer sk-b", ""));
    // Two keys of one tenant share it; each key keeps its own rate-limit account.
    EXPECT_EQ(a1.tenant, "t:acme");
    EXPECT_EQ(a1.tenant, a2.tenant);
    EXPECT_NE(a1.account, a2.account);
    EXPECT_EQ(a1.tenant_name, "acme");
    EXPECT_FALSE(a1.admin);
    EXPECT_TRUE(a2.admin);
    // A key with no tenant is its own, and never one of the named tenants.
    EXPECT_EQ(solo.tenant, owner_of("sk-solo"));
    EXPECT_NE(solo.tenant, a1.tenant);
    EXPECT_EQ(b.tenant, "t:beta");
    EXPECT_EQ(k.keys()[0].limits->requests_per_min, 60);
    EXPECT_EQ(k.keys()[3].limits->tokens_per_min, 1000);
    EXPECT_FALSE(k.keys()[2].limits.has_value());
}

TEST(Auth, KeyFileErrorsNameTheLine) {
    const std::string path = testing::TempDir() + "/bad-keys.txt";
    for (const char * bad : {"sk-a tenant=\n", "sk-a tenant=a/b\n", "sk-a role=admin\n", "sk-a rpm=x\n"}) {
        std::ofstream(path) << "# first\n" << bad;
        ApiKeys k;
        const std::string err = k.load_file(path);
        EXPECT_NE(err.find(":2: "), std::string::npos) << bad << " -> " << err;
    }
}

TEST(Auth, OperatorKeyIsAdminAndNoKeysMeansOneTenant) {
    ApiKeys none;
    const Caller anon = none.caller(nullptr);
    EXPECT_EQ(anon.tenant, "");
    EXPECT_TRUE(anon.admin);
    ApiKeys op;
    op.add("sk-op");
    EXPECT_TRUE(op.caller(op.check("Bearer sk-op", "")).admin);
    EXPECT_FALSE(op.caller(nullptr).admin);
}

TEST(Auth, FlagsGiveTheOperatorsKeyAndTheFilesKeys) {
    const std::string path = testing::TempDir() + "/flag-keys.txt";
    std::ofstream(path) << "sk-t tenant=acme\n";
    ApiKeys k;
    ASSERT_EQ(k.load_flags("sk-op", path), "");
    EXPECT_TRUE(k.caller(k.check("Bearer sk-op", "")).admin);
    EXPECT_EQ(k.caller(k.check("Bearer sk-t", "")).tenant, "t:acme");
    ApiKeys only_flag;
    EXPECT_EQ(only_flag.load_flags("sk-op", ""), "");
    EXPECT_TRUE(only_flag.enabled());
    ApiKeys none;
    EXPECT_EQ(none.load_flags("", ""), "");
    EXPECT_FALSE(none.enabled());
    ApiKeys bad;
    EXPECT_NE(bad.load_flags("sk-op", "/nonexistent/keys"), "");
}

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
    EXPECT_EQ(k.check("Bearer sk-1", ""), "sk-1");
    EXPECT_EQ(k.check("", "sk-1"), "sk-1");
    EXPECT_EQ(k.check("Bearer sk-2", ""), "");
    EXPECT_EQ(k.check("Basic sk-1", ""), "");
    EXPECT_EQ(k.check("", ""), "");
}

TEST(Auth, KeyFile) {
    const std::string path = testing::TempDir() + "/keys.txt";
    std::ofstream(path) << "# comment\nsk-a\n\nsk-b\r\n";
    ApiKeys k;
    EXPECT_EQ(k.load_file(path), "");
    EXPECT_EQ(k.check("Bearer sk-b", ""), "sk-b");
    EXPECT_NE(k.load_file("/nonexistent/keys"), "");
}

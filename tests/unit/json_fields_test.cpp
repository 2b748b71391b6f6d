// Typed reads of a field: a value of the wrong type reads as none, and nothing throws.
#include "common/json_fields.h"

#include <gtest/gtest.h>

using armada::common::array_field;
using armada::common::bool_field;
using armada::common::int_field;
using armada::common::object_at;
using armada::common::object_field;
using armada::common::string_field;
using armada::common::uint_field;
using nlohmann::json;

TEST(JsonFields, EachTypeReadsOnlyItsOwnKind) {
    const json j = json::parse(R"({"s":"x","i":-3,"u":7,"f":1.5,"b":true,"o":{"k":1},"a":[1],"n":null})");
    EXPECT_EQ(string_field(j, "s"), "x");
    EXPECT_EQ(string_field(j, "i"), std::nullopt);
    EXPECT_EQ(int_field(j, "i"), -3);
    EXPECT_EQ(int_field(j, "f"), std::nullopt);
    EXPECT_EQ(int_field(j, "s"), std::nullopt);
    EXPECT_EQ(uint_field(j, "u"), 7u);
    EXPECT_EQ(uint_field(j, "i"), std::nullopt);
    EXPECT_EQ(bool_field(j, "b"), true);
    EXPECT_EQ(bool_field(j, "i"), std::nullopt);
    ASSERT_NE(object_field(j, "o"), nullptr);
    EXPECT_EQ(object_field(j, "a"), nullptr);
    ASSERT_NE(array_field(j, "a"), nullptr);
    EXPECT_EQ(array_field(j, "o"), nullptr);
    EXPECT_EQ(string_field(j, "missing"), std::nullopt);
    EXPECT_EQ(string_field(j, "n"), std::nullopt);
}

TEST(JsonFields, NotAnObjectHasNoFields) {
    for (const char * text : {"[1,2]", "\"s\"", "3", "null", "true"}) {
        const json j = json::parse(text);
        EXPECT_EQ(string_field(j, "s"), std::nullopt) << text;
        EXPECT_EQ(int_field(j, "0"), std::nullopt) << text;
        EXPECT_EQ(object_at(j, {}), nullptr) << text;
        EXPECT_EQ(object_at(j, {"a"}), nullptr) << text;
    }
}

TEST(JsonFields, ObjectAtFollowsAPathOfObjects) {
    const json j = json::parse(R"({"metadata":{"labels":{"app":"armada"},"list":[{"x":1}]}})");
    const json * labels = object_at(j, {"metadata", "labels"});
    ASSERT_NE(labels, nullptr);
    EXPECT_EQ(string_field(*labels, "app"), "armada");
    EXPECT_EQ(object_at(j, {}), &j);
    EXPECT_EQ(object_at(j, {"metadata", "list"}), nullptr);           // an array on the way
    EXPECT_EQ(object_at(j, {"metadata", "labels", "app"}), nullptr);  // a string at the end
    EXPECT_EQ(object_at(j, {"metadata", "missing", "labels"}), nullptr);
}

TEST(JsonFields, TextReplacesInvalidUtf8InsteadOfThrowing) {
    const json j = {{"s", std::string("a\xff"
                                      "b")}};
    EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
    EXPECT_EQ(armada::common::json_text(j),
              "{\"s\":\"a\xef\xbf\xbd"
              "b\"}");
}

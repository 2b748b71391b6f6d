// store::open: the backend chosen by what the user wrote.

#include "store/open.h"

#include <gtest/gtest.h>

#include <filesystem>

using namespace armada;

TEST(StoreOpen, PostgresUrlsAreSplitOnCommasAndAnythingElseNamesNone) {
    using V = std::vector<std::string>;
    EXPECT_EQ(store::postgres_urls("postgres://a@h/db"), V{"postgres://a@h/db"});
    EXPECT_EQ(store::postgres_urls("postgresql://h/a,postgres://h/b"), (V{"postgresql://h/a", "postgres://h/b"}));
    EXPECT_EQ(store::postgres_urls("postgres://h/a,,postgres://h/b,"), (V{"postgres://h/a", "postgres://h/b"}));
    EXPECT_TRUE(store::postgres_urls("sqlite").empty());
    EXPECT_TRUE(store::postgres_urls("").empty());
    EXPECT_TRUE(store::postgres_urls("mysql://h/db").empty());
}

TEST(StoreOpen, SqliteByDefaultAndAClearErrorForAnUnknownBackend) {
    const auto dir = std::filesystem::temp_directory_path() / ("armada-store-open-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::string err;
    for (const std::string state : {"", "sqlite"}) {
        auto st = store::open(state, {dir.string(), 1}, err);
        ASSERT_TRUE(st) << "'" << state << "': " << err;
        EXPECT_TRUE(st->writable().ok);
    }
    EXPECT_TRUE(std::filesystem::exists(dir / "armada.db"));
    err.clear();
    EXPECT_FALSE(store::open("mysql://h/db", {dir.string(), 1}, err));
    EXPECT_NE(err.find("sqlite or postgres://"), std::string::npos) << err;
    std::filesystem::remove_all(dir);
}

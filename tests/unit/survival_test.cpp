#include "cluster/survival.h"

#include <gtest/gtest.h>

#include <cmath>

using armada::cluster::survival_by_cell;
using EndedCount = armada::store::Store::EndedCount;

TEST(ChainSurvival, OutcomesAreToldApartAndCancelsCountOnNeitherSide) {
    const std::vector<EndedCount> rows = {
        {"c0", "completed", false, false, 6}, {"c0", "completed", false, true, 2},  // a moved session that made it
        {"c0", "failed", true, false, 1},     {"c0", "failed", false, true, 1},     // timed out; lost after a move
        {"c0", "failed", false, false, 2},    {"c0", "cancelled", false, false, 5},
        {"c1", "completed", false, false, 3},
    };
    const auto by = survival_by_cell(rows);
    const auto & c0 = by.at("c0");
    EXPECT_EQ(c0.completed, 8);
    EXPECT_EQ(c0.timed_out, 1);
    EXPECT_EQ(c0.lost, 1);
    EXPECT_EQ(c0.failed, 2);
    EXPECT_EQ(c0.cancelled, 5);
    EXPECT_DOUBLE_EQ(c0.ratio(), 8.0 / 12.0);
    EXPECT_DOUBLE_EQ(by.at("c1").ratio(), 1.0);
    EXPECT_DOUBLE_EQ(by.at("").ratio(), 11.0 / 15.0);  // the cluster: every cell
    EXPECT_EQ(by.at("").cancelled, 5);
}

TEST(ChainSurvival, NothingDecidedIsNotAHundredPercent) {
    const auto by = survival_by_cell({{"c0", "cancelled", false, false, 3}});
    EXPECT_TRUE(std::isnan(by.at("c0").ratio()));
    EXPECT_TRUE(std::isnan(by.at("").ratio()));
}

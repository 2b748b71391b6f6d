// What a node lets come when it fetches a moving session's KV: no more than the move command
// states (what the node it leaves said its journal can be) and no more than its own --kv-disk.
#include "cli/kv_move.h"

#include <gtest/gtest.h>

using armada::cli::kv_offer_problem;

TEST(KvOffer, AJournalWithinWhatTheCommandStatesAndTheDiskIsFetched) {
    EXPECT_EQ(kv_offer_problem(1000, 1000, 1 << 20), "");
    EXPECT_EQ(kv_offer_problem(10, 1000, 1 << 20), "");
}

TEST(KvOffer, MoreThanTheMoveCommandStatesIsRefusedWithBothFigures) {
    const std::string e = kv_offer_problem(1001, 1000, 1 << 20);
    EXPECT_NE(e.find("1001"), std::string::npos) << e;
    EXPECT_NE(e.find("move command's 1000"), std::string::npos) << e;
}

TEST(KvOffer, MoreThanTheDiskIsRefusedEvenWhenTheCommandStatesMore) {
    const std::string e = kv_offer_problem(5000, 10000, 4096);
    EXPECT_NE(e.find("--kv-disk (4096)"), std::string::npos) << e;
}

TEST(KvOffer, ACommandThatStatesNothingLeavesTheDiskBound) {
    EXPECT_EQ(kv_offer_problem(4096, 0, 4096), "");
    EXPECT_NE(kv_offer_problem(4097, 0, 4096), "");
}

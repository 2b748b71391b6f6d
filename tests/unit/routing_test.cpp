#include "gateway/routing.h"

#include <gtest/gtest.h>

namespace armada::gateway {
namespace {

NodeViews three() {
    NodeViews n;
    n["a"] = {"cell0", {}};
    n["a"].load.free_seqs = 3;
    n["b"] = {"cell0", {}};
    n["b"].load.free_seqs = 5;
    n["c"] = {"cell1", {}};
    n["c"].load.free_seqs = 5;
    return n;
}

TEST(ChatRoute, AConversationStaysOnItsNodeWhileItHasRoom) {
    const auto n = three();
    // "a" has less room than the others: only the binding sends the turn there.
    for (uint64_t rr = 0; rr < 4; ++rr)
        EXPECT_EQ(chat_route(n, std::string("a"), rr), "a");
}

TEST(ChatRoute, AFullNodeSendsTheTurnByLoad) {
    auto n = three();
    n["a"].load.free_seqs = 0;
    EXPECT_EQ(chat_route(n, std::string("a"), 0), "b");
    EXPECT_EQ(chat_route(n, std::string("a"), 1), "c");
}

TEST(ChatRoute, ADrainingOrGoneNodeSendsTheTurnByLoad) {
    auto n = three();
    n["b"].load.draining = true;
    EXPECT_EQ(chat_route(n, std::string("b"), 0), "c");
    const auto live = three();
    EXPECT_EQ(chat_route(live, std::string("gone"), 0), "b");
    EXPECT_EQ(chat_route(live, std::string("gone"), 1), "c");
}

TEST(ChatRoute, ANewConversationGoesToTheNodeWithMostRoomAndNoneWithoutNodes) {
    auto n = three();
    n["c"].load.free_seqs = 9;
    EXPECT_EQ(chat_route(n, std::nullopt, 0), "c");
    EXPECT_EQ(chat_route({}, std::nullopt, 0), std::nullopt);
    for (auto & [_, v] : n)
        v.load.draining = true;
    EXPECT_EQ(chat_route(n, std::string("a"), 0), std::nullopt);
}

TEST(MostRoom, KeepsToTheCellAndAvoidsTheNodeTried) {
    const auto n = three();
    EXPECT_EQ(most_room(n), (std::vector<std::string>{"b", "c"}));
    EXPECT_EQ(most_room(n, "cell0"), (std::vector<std::string>{"b"}));
    EXPECT_EQ(most_room(n, "cell0", "b"), (std::vector<std::string>{"a"}));
    EXPECT_TRUE(most_room(n, "cell2").empty());
}

}  // namespace
}  // namespace armada::gateway

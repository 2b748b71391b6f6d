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
    uint64_t rr = 0;
    // "a" has less room than the others: only the binding sends the turn there.
    for (int turn = 0; turn < 4; ++turn)
        EXPECT_EQ(chat_route(n, std::string("a"), rr), "a");
    EXPECT_EQ(rr, 0u);  // turns that stay do not move the round-robin
}

TEST(ChatRoute, NewConversationsTakeTurnsAmongEqualNodesWhateverTheirFollowUpTurns) {
    const auto n = three();
    uint64_t rr = 0;
    std::vector<std::string> firsts;
    for (int c = 0; c < 4; ++c) {
        const auto first = chat_route(n, std::nullopt, rr);
        ASSERT_TRUE(first);
        firsts.push_back(*first);
        for (int turn = 0; turn < 2; ++turn)
            EXPECT_EQ(chat_route(n, first, rr), *first);
    }
    EXPECT_EQ(firsts, (std::vector<std::string>{"b", "c", "b", "c"}));
}

TEST(ChatRoute, AFullNodeSendsTheTurnByLoad) {
    auto n = three();
    n["a"].load.free_seqs = 0;
    uint64_t rr = 0;
    EXPECT_EQ(chat_route(n, std::string("a"), rr), "b");
    EXPECT_EQ(chat_route(n, std::string("a"), rr), "c");
}

TEST(ChatRoute, ADrainingOrGoneNodeSendsTheTurnByLoad) {
    auto n = three();
    n["b"].load.draining = true;
    uint64_t rr = 0;
    EXPECT_EQ(chat_route(n, std::string("b"), rr), "c");
    const auto live = three();
    rr = 0;
    EXPECT_EQ(chat_route(live, std::string("gone"), rr), "b");
    EXPECT_EQ(chat_route(live, std::string("gone"), rr), "c");
}

TEST(ChatRoute, ANewConversationGoesToTheNodeWithMostRoomAndNoneWithoutNodes) {
    auto n = three();
    n["c"].load.free_seqs = 9;
    uint64_t rr = 0;
    EXPECT_EQ(chat_route(n, std::nullopt, rr), "c");
    EXPECT_EQ(chat_route({}, std::nullopt, rr), std::nullopt);
    for (auto & [_, v] : n)
        v.load.draining = true;
    EXPECT_EQ(chat_route(n, std::string("a"), rr), std::nullopt);
}

TEST(HttpRoute, IdsInThePathBecomeAPlaceholder) {
    EXPECT_EQ(http_route("/v1/sessions/sess_abc/events"), "/v1/sessions/{id}/events");
    EXPECT_EQ(http_route("/v1/sessions/sess_abc"), "/v1/sessions/{id}");
    EXPECT_EQ(http_route("/v1/agents/a1/sessions"), "/v1/agents/{id}/sessions");
    EXPECT_EQ(http_route("/v1/chat/completions"), "/v1/chat/completions");
    EXPECT_EQ(http_route("/v1/responses/resp_1"), "/v1/responses/{id}");
    EXPECT_EQ(http_route("/healthz"), "/healthz");
    EXPECT_EQ(http_route("/"), "/");
}

TEST(MostRoom, KeepsToTheCellAndAvoidsTheNodeTried) {
    const auto n = three();
    EXPECT_EQ(most_room(n), (std::vector<std::string>{"b", "c"}));
    EXPECT_EQ(most_room(n, "cell0"), (std::vector<std::string>{"b"}));
    EXPECT_EQ(most_room(n, "cell0", {"b"}), (std::vector<std::string>{"a"}));
    // Every node tried so far is left out, not only the last one.
    EXPECT_EQ(most_room(n, {}, {"b", "c"}), (std::vector<std::string>{"a"}));
    EXPECT_TRUE(most_room(n, {}, {"a", "b", "c"}).empty());
    EXPECT_TRUE(most_room(n, "cell2").empty());
}

}  // namespace
}  // namespace armada::gateway

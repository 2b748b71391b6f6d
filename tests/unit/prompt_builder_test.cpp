// The pure pieces of an agent step's prompt (agent/prompt_builder.h).
#include "agent/prompt_builder.h"

#include <gtest/gtest.h>

using namespace armada;
using namespace armada::agent;

namespace {

common_chat_msg msg(const std::string & role, const std::string & content, const std::string & tool = {}) {
    common_chat_msg m;
    m.role = role;
    m.content = content;
    m.tool_name = tool;
    return m;
}

AgentSpec agent_with_tools() {
    AgentSpec a;
    a.instructions = "Be brief.";
    tools::HttpToolSpec t;
    t.name = "fetch";
    t.description = "Fetches a page";
    t.parameters = R"({"type":"object"})";
    a.tools.push_back(t);
    return a;
}

std::vector<common_chat_msg> three_tool_turns() {
    return {msg("user", "go"),
            msg("assistant", ""),
            msg("tool", "one", "fetch"),
            msg("assistant", ""),
            msg("tool", "two", "search"),
            msg("assistant", ""),
            msg("tool", "three", "fetch")};
}

}  // namespace

TEST(PromptBuilder, ToolOutputsAreLabelledAndTheOldestDroppedOnesBecomeANote) {
    const auto a = agent_with_tools();
    const auto t = three_tool_turns();
    auto m = prompt_messages(a, t, 0);
    ASSERT_EQ(m.size(), t.size() + 1);
    EXPECT_EQ(m[0].role, "system");
    EXPECT_NE(m[0].content.find("Be brief."), std::string::npos);
    EXPECT_NE(m[0].content.find("untrusted"), std::string::npos);
    EXPECT_EQ(m[3].content, label_tool_output("fetch", "one"));
    m = prompt_messages(a, t, 2);
    EXPECT_EQ(m[3].content, "[output of fetch removed to keep the session within its memory cap]");
    EXPECT_EQ(m[5].content, "[output of search removed to keep the session within its memory cap]");
    EXPECT_EQ(m[7].content, label_tool_output("fetch", "three"));
    EXPECT_EQ(m[1].content, "go");  // the rest as it was
    // No instructions and no tools: no system message.
    EXPECT_EQ(prompt_messages(AgentSpec{}, {msg("user", "hi")}, 0).size(), 1u);
}

TEST(PromptBuilder, CompactionKeepsTheNewestToolOutputs) {
    const auto t = three_tool_turns();
    EXPECT_EQ(tool_outputs_to_drop(t, 1), 2);
    EXPECT_EQ(tool_outputs_to_drop(t, 0), 3);
    EXPECT_EQ(tool_outputs_to_drop(t, 5), 0);
    EXPECT_EQ(tool_outputs_to_drop(t, -1), 0);  // the agent does not compact
}

TEST(PromptBuilder, ToolsAreRequiredForTheFirstStepsAndOffForTheAnswerWhenAsked) {
    auto a = agent_with_tools();
    a.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    EXPECT_EQ(step_tool_choice(a, 0), COMMON_CHAT_TOOL_CHOICE_AUTO);
    a.min_tool_steps = 2;
    EXPECT_EQ(step_tool_choice(a, 0), COMMON_CHAT_TOOL_CHOICE_REQUIRED);
    EXPECT_EQ(step_tool_choice(a, 1), COMMON_CHAT_TOOL_CHOICE_REQUIRED);
    EXPECT_EQ(step_tool_choice(a, 2), COMMON_CHAT_TOOL_CHOICE_AUTO);
    a.answer_without_tools = true;
    EXPECT_EQ(step_tool_choice(a, 2), COMMON_CHAT_TOOL_CHOICE_NONE);
    const auto tools = prompt_tools(a);
    ASSERT_EQ(tools.size(), 1u);
    EXPECT_EQ(tools[0].name, "fetch");
    EXPECT_EQ(tools[0].parameters, R"({"type":"object"})");
}

TEST(PromptBuilder, TheMemoryCapIsTheSmallestOfTheContextAndTheAgentsCaps) {
    AgentLimits l;
    EXPECT_EQ(memory_cap(l, 4096, 1024), 4095);
    l.max_context_tokens = 1000;
    EXPECT_EQ(memory_cap(l, 4096, 1024), 1000);
    l.max_kv_bytes = 512 * 1024;  // 512 tokens at 1 KiB a token
    EXPECT_EQ(memory_cap(l, 4096, 1024), 512);
    EXPECT_EQ(memory_cap(l, 4096, 0), 1000);  // bytes per token not known: the byte cap cannot apply
    EXPECT_EQ(memory_cap(l, 300, 1024), 299);
}

TEST(PromptBuilder, AStepIsLongOnlyWhenItReadsAMarkedToolsOutput) {
    auto a = agent_with_tools();
    a.long_after_tools = {"search"};
    auto t = three_tool_turns();
    EXPECT_FALSE(reads_long_tool_output(a, t));  // the last output is fetch's
    t.back().tool_name = "search";
    EXPECT_TRUE(reads_long_tool_output(a, t));
    t.push_back(msg("assistant", "done"));
    EXPECT_FALSE(reads_long_tool_output(a, t));  // the step after it reads no tool output
}

TEST(PromptBuilder, TheSharedPrefixIsWhatTwoRendersShareWhenLongEnoughAndThePromptGoesPastIt) {
    engine::Tokens x, y;
    for (int i = 0; i < 20; ++i) {
        x.push_back(i);
        y.push_back(i);
    }
    x.push_back(100);
    y.push_back(200);
    const auto p = common_prefix(x, y);
    EXPECT_EQ(p.size(), 20u);
    EXPECT_EQ(shared_prefix_length(p, x), 20);
    EXPECT_EQ(shared_prefix_length(p, p), 0);  // nothing past it
    engine::Tokens other = x;
    other[3] = 99;
    EXPECT_EQ(shared_prefix_length(p, other), 0);  // not its prefix
    const engine::Tokens short_prefix(x.begin(), x.begin() + 15);
    EXPECT_EQ(shared_prefix_length(short_prefix, x), 0);  // too short to be worth caching
}

// The gateway's generation plan (gateway/generation_router.h): where a completion goes from its
// facts alone, before any pool is asked.
#include "gateway/generation_router.h"

#include <gtest/gtest.h>

using namespace armada;
using routing::plan_generation;
using routing::prompt_fits;
using routing::TargetContexts;
using routing::tokens_that_matter;

namespace {

std::vector<routing::RouteRule> rules() {
    routing::RouteRule long_prompts;
    long_prompts.name = "long-prompt";
    long_prompts.prompt_tokens_over = 2000;
    long_prompts.to = "gpu";
    routing::RouteRule interactive;
    interactive.name = "interactive";
    interactive.latency = {"interactive"};
    interactive.to = "gpu";
    return {long_prompts, interactive};
}

routing::RouteFacts facts(int64_t prompt, std::string latency = "batch") {
    routing::RouteFacts f;
    f.prompt_tokens = prompt;
    f.latency = std::move(latency);
    return f;
}

}  // namespace

TEST(GenerationPlan, TheFirstRuleThatMatchesChoosesAndNoneMeansTheCpuNodes) {
    const TargetContexts c{4096, {{"gpu", 32768}, {"big", 131072}}};
    auto p = plan_generation(rules(), facts(2500), true, c);
    EXPECT_EQ(p.target, "gpu");
    EXPECT_EQ(p.rule, "long-prompt");
    p = plan_generation(rules(), facts(100, "interactive"), true, c);
    EXPECT_EQ(p.target, "gpu");
    EXPECT_EQ(p.rule, "interactive");
    p = plan_generation(rules(), facts(100), true, c);
    EXPECT_EQ(p.target, "cpu");
    EXPECT_EQ(p.rule, "default");
    // A body that is not an object goes to a node, which answers it, whatever its facts.
    p = plan_generation(rules(), facts(2500), false, c);
    EXPECT_EQ(p.target, "cpu");
    EXPECT_EQ(p.rule, "default");
}

TEST(GenerationPlan, APromptThatFitsNeitherItsTargetNorTheCpuGoesToTheFirstPoolThatHoldsIt) {
    const TargetContexts c{4096, {{"gpu", 32768}, {"big", 131072}}};
    auto p = plan_generation(rules(), facts(40000), true, c);
    EXPECT_EQ(p.target, "big");
    EXPECT_EQ(p.rule, "context");
    // It fits the CPU nodes: the rule stands, even where the rule's pool could not hold it.
    const TargetContexts small_gpu{8192, {{"gpu", 2048}}};
    p = plan_generation(rules(), facts(2500), true, small_gpu);
    EXPECT_EQ(p.target, "gpu");
    EXPECT_EQ(p.rule, "long-prompt");
    // It fits nowhere: the plan keeps the rule's target, and the caller refuses it (413).
    p = plan_generation(rules(), facts(500000), true, c);
    EXPECT_EQ(p.target, "gpu");
    EXPECT_FALSE(prompt_fits(500000, c.of(p.target)));
    EXPECT_FALSE(prompt_fits(500000, c.cpu));
}

TEST(GenerationPlan, PromptsNotCountedOrTargetsOfUnknownSizeAreTakenToFit) {
    EXPECT_TRUE(prompt_fits(-1, 10));
    EXPECT_TRUE(prompt_fits(1000000, 0));
    EXPECT_TRUE(prompt_fits(9, 10));
    EXPECT_FALSE(prompt_fits(10, 10));
    const TargetContexts unknown{0, {{"gpu", 0}}};
    const auto p = plan_generation(rules(), facts(-1), true, unknown);
    EXPECT_EQ(p.target, "cpu");
    EXPECT_EQ(unknown.of("nowhere"), 0);
}

TEST(GenerationPlan, CountingStopsAtTheLargestNumberADecisionTellsApart) {
    EXPECT_EQ(tokens_that_matter(rules(), {4096, {{"gpu", 32768}}}), 2000);
    EXPECT_EQ(tokens_that_matter({}, {4096, {{"gpu", 32768}}}), 4095);
    EXPECT_EQ(tokens_that_matter({}, {0, {{"gpu", 1024}}}), 1023);
    EXPECT_EQ(tokens_that_matter({}, {0, {}}), std::numeric_limits<int64_t>::max());
}

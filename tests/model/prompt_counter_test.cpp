// The gateway's prompt counter on the tiny model's vocabulary and chat template: exact counts
// match the node's, and the shortcut for small prompts never says fewer tokens than there are.
#include "gateway/prompt_counter.h"
#include "api/json_util.h"

#include <gtest/gtest.h>
#include <llama.h>

#include <cstdlib>
#include <string>

using namespace armada;

namespace {

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

const gateway::PromptCounter & counter() {
    static std::unique_ptr<gateway::PromptCounter> c = [] {
        llama_log_set(quiet_log, nullptr);
        const char * dir = std::getenv("ARMADA_MODEL_DIR");
        std::string err;
        auto p = gateway::PromptCounter::load(std::string(dir ? dir : "") + "/armada-tiny-q8_0.gguf", err);
        if (!p) ADD_FAILURE() << err;
        return p;
    }();
    return *c;
}

api::json conversation(int turns, const std::string & word, int words) {
    api::json msgs = api::json::array();
    msgs.push_back({{"role", "system"}, {"content", "You plan carefully."}});
    std::string text;
    for (int i = 0; i < words; ++i)
        text += (i ? " " : "") + word;
    for (int t = 0; t < turns; ++t) {
        msgs.push_back({{"role", "user"}, {"content", text}});
        if (t + 1 < turns) msgs.push_back({{"role", "assistant"}, {"content", "ok " + std::to_string(t)}});
    }
    return {{"messages", msgs}, {"max_tokens", 8}};
}

}  // namespace

TEST(PromptCounter, TheShortcutNeverUndercountsAndLongPromptsAreCountedExactly) {
    const auto & c = counter();
    for (int turns : {1, 3, 8}) {
        for (const char * word : {"ox", "internationalization", "\xe4\xbd\xa0\xe5\xa5\xbd", "\\n\"", "7"}) {
            for (int words : {0, 5, 60}) {
                const auto body = conversation(turns, word, words);
                const std::string text = body.dump();
                const auto exact = c.chat(body);
                ASSERT_TRUE(exact);
                const auto bound = c.chat(body, text.size(), 1 << 20);
                ASSERT_TRUE(bound);
                EXPECT_GE(*bound, *exact) << text;
                // Asked about a threshold below the bound, it counts.
                EXPECT_EQ(*c.chat(body, text.size(), *bound - 1), *exact) << text;
            }
        }
    }
    // A prompt past the threshold is never answered by the bound.
    const auto big = conversation(1, "ox", 2000);
    EXPECT_GT(*c.chat(big, big.dump().size(), 400), 400);
    EXPECT_EQ(*c.chat(big, big.dump().size(), 400), *c.chat(big));
}

TEST(PromptCounter, RequestsWithToolsAreAlwaysCountedAndBadBodiesAreLeftToTheNode) {
    const auto & c = counter();
    auto body = conversation(1, "ox", 3);
    body["tools"] = api::json::array({{{"type", "function"},
                                       {"function",
                                        {{"name", "search"},
                                         {"description", "search the web"},
                                         {"parameters", {{"type", "object"}, {"properties", api::json::object()}}}}}}});
    EXPECT_EQ(*c.chat(body, body.dump().size(), 1 << 20), *c.chat(body));
    EXPECT_FALSE(c.chat(api::json{{"messages", "not a list"}}));
    api::json completion{{"prompt", "ox ox ox"}};
    EXPECT_GE(*c.completion(completion), 3);
    EXPECT_EQ(*c.completion(api::json{{"prompt", {1, 2, 3}}}), 3);
}

// Model output parsed as tool calls (the tiny model's Qwen2 chat format, with tools): any text,
// complete or partial, becomes a message; calls kept have a name and an object of arguments.
#include "engine/chat_format.h"

#include <cstdlib>
#include <nlohmann/json.hpp>

using namespace armada::engine;

namespace {
std::shared_ptr<ChatFormat> format;
ChatTurn turn;

void quiet(ggml_log_level, const char *, void *) {}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    const char * dir = std::getenv("ARMADA_MODEL_DIR");
    std::string err;
    auto model = Model::load(std::string(dir ? dir : ".") + "/armada-tiny-q8_0.gguf", nullptr, err);
    if (!model) {
        std::fprintf(stderr, "tool_call_output: %s (set ARMADA_MODEL_DIR)\n", err.c_str());
        std::exit(1);
    }
    format = std::make_shared<ChatFormat>(model);
    common_chat_msg user;
    user.role = "user";
    user.content = "hi";
    common_chat_tool tool;
    tool.name = "lookup";
    tool.description = "Look something up";
    tool.parameters = R"({"type":"object","properties":{"q":{"type":"string"}},"required":["q"]})";
    turn = format->render({user}, {tool}, COMMON_CHAT_TOOL_CHOICE_AUTO, true);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size == 0) return 0;
    const bool partial = data[0] & 1;
    const std::string text(reinterpret_cast<const char *>(data + 1), size - 1);
    const common_chat_msg m = format->parse(turn, text, partial);
    if (!partial) {
        for (const auto & c : m.tool_calls) {
            if (c.name.empty()) std::abort();
            const auto args = nlohmann::json::parse(c.arguments, nullptr, false);
            if (!args.is_object()) std::abort();
        }
    }
    format->try_parse(turn, text, partial);
    return 0;
}

#pragma once
// The tiny model every model test runs on, loaded once per test binary from ARMADA_MODEL_DIR.
#include "engine/model.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace armada::testing {

inline void quiet_llama_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

inline std::shared_ptr<engine::Model> tiny_model() {
    static std::shared_ptr<engine::Model> m = [] {
        llama_log_set(quiet_llama_log, nullptr);
        const char * dir = std::getenv("ARMADA_MODEL_DIR");
        std::string err;
        auto mm = engine::Model::load(std::string(dir ? dir : "") + "/armada-tiny-q8_0.gguf", nullptr, err);
        if (!mm) ADD_FAILURE() << err;
        return mm;
    }();
    return m;
}

}  // namespace armada::testing

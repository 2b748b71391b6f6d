#pragma once

#include <cstdint>
#include <string>

namespace armada::cli {

//! Hyper-parameters of a qwen2-architecture model shape.
struct ModelShape {
    std::string name;
    int n_layer = 0;
    int n_embd = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int n_ff = 0;
    int n_ctx_train = 32768;
    bool tied_output = true;  // Qwen2.5 small models reuse token_embd as the output head
};

//! Options of `armada mkmodel`.
struct MkModelOptions {
    std::string shape = "tiny";
    std::string type = "f16";
    std::string output;
    std::string vocab;      // GGUF holding the tokenizer (default: llama.cpp's ggml-vocab-qwen2.gguf)
    std::string template_;  // Jinja chat template file (default: Qwen2.5-7B-Instruct's)
    uint64_t seed = 42;
};

//! Looks up a named shape; returns false for an unknown name.
bool find_shape(const std::string & name, ModelShape & out);

//! Writes a random-weight GGUF; returns an error message, empty on success.
std::string write_model(const MkModelOptions & opt);

}  // namespace armada::cli

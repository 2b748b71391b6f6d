#pragma once

#include <llama.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace armada::engine {

using Tokens = std::vector<llama_token>;

//! How many leading tokens two sequences share.
inline size_t common_prefix(const Tokens & a, const Tokens & b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n])
        ++n;
    return n;
}

//! How a model is loaded.
struct ModelLoadOptions {
    //! Map the file (weights in the page cache, shared by every user of the file). Off: read
    //! into private memory, first touched by the loading thread, so it follows `memory_node`.
    bool mmap = true;
    int memory_node = -1;  // NUMA node preferred while loading; -1: none
    //! The vocabulary and metadata only (tokenising and chat templates), no weights: what a
    //! gateway needs to count a prompt's tokens.
    bool vocab_only = false;
};

//! A loaded GGUF model, shared read-only by every engine instance and API thread.
//! Tokenising and detokenising are thread-safe in llama.cpp; nothing here mutates the model.
class Model {
  public:
    //! Loads `path`; `progress` gets 0..1 and runs on the loading thread. Returns nullptr and
    //! fills `error` when the file is missing or llama.cpp rejects it.
    static std::shared_ptr<Model> load(const std::string & path, const std::function<void(float)> & progress,
                                       std::string & error, const ModelLoadOptions & opt = {});
    ~Model();

    llama_model * get() const { return model_; }
    const llama_vocab * vocab() const { return vocab_; }
    int32_t n_vocab() const { return n_vocab_; }
    int32_t n_ctx_train() const;
    const std::string & path() const { return path_; }
    //! Model id shown by /v1/models: the file name without directory and extension.
    const std::string & id() const { return id_; }
    uint64_t size_bytes() const;

    //! Text to tokens; `special` lets control-token text like `<|im_start|>` map to its id.
    Tokens tokenize(const std::string & text, bool add_bos, bool special) const;
    //! One token's text; `special` renders control tokens instead of dropping them.
    std::string piece(llama_token t, bool special) const;
    bool is_eog(llama_token t) const { return llama_vocab_is_eog(vocab_, t); }
    //! A metadata value of the GGUF ("" when absent).
    std::string meta(const std::string & key) const;
    //! Bytes one token's KV takes in a context whose caches are `type_k` and `type_v`: every
    //! layer's keys and values for the KV heads (grouped-query attention), with the model's own
    //! key and value head sizes.
    uint64_t kv_bytes_per_token(ggml_type type_k, ggml_type type_v) const;

  private:
    Model() = default;
    llama_model * model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    int32_t n_vocab_ = 0;
    std::string path_, id_;
};

}  // namespace armada::engine

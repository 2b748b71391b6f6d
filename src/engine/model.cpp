#include "engine/model.h"

#include "engine/gguf_check.h"
#include "engine/topology.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <mutex>

namespace armada::engine {

namespace {
std::once_flag g_backend_once;

bool progress_trampoline(float p, void * user) {
    (*static_cast<const std::function<void(float)> *>(user))(p);
    return true;
}
}  // namespace

std::shared_ptr<Model> Model::load(const std::string & path, const std::function<void(float)> & progress,
                                   std::string & error, const ModelLoadOptions & opt) {
    std::call_once(g_backend_once, [] { llama_backend_init(); });
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
        error = "model file not found: " + path;
        return nullptr;
    }
    if (auto bad = check_gguf(path); !bad.empty()) {
        error = "model file " + path + " is rejected: " + bad;
        return nullptr;
    }
    auto mp = llama_model_default_params();
    if (progress) {
        mp.progress_callback = progress_trampoline;
        mp.progress_callback_user_data = const_cast<std::function<void(float)> *>(&progress);
    }
    if (!opt.mmap) mp.load_mode = LLAMA_LOAD_MODE_NONE;  // read into private buffers
    mp.vocab_only = opt.vocab_only;
    std::shared_ptr<Model> m(new Model());
    if (opt.memory_node >= 0) {
        if (auto e = prefer_memory_node(opt.memory_node); !e.empty()) spdlog::warn("model: {}", e);
    }
    m->model_ = llama_model_load_from_file(path.c_str(), mp);
    if (opt.memory_node >= 0) prefer_memory_node(-1);
    if (!m->model_) {
        error = "llama.cpp could not load " + path + " (not a valid GGUF model?)";
        return nullptr;
    }
    m->vocab_ = llama_model_get_vocab(m->model_);
    m->n_vocab_ = llama_vocab_n_tokens(m->vocab_);
    m->path_ = path;
    m->id_ = std::filesystem::path(path).stem().string();
    return m;
}

Model::~Model() {
    if (model_) llama_model_free(model_);
}

int32_t Model::n_ctx_train() const {
    return llama_model_n_ctx_train(model_);
}

uint64_t Model::size_bytes() const {
    return llama_model_size(model_);
}

Tokens Model::tokenize(const std::string & text, bool add_bos, bool special) const {
    Tokens out(text.size() + 2);
    int32_t n =
        llama_tokenize(vocab_, text.data(), int32_t(text.size()), out.data(), int32_t(out.size()), add_bos, special);
    if (n < 0) {
        out.resize(size_t(-n));
        n = llama_tokenize(vocab_, text.data(), int32_t(text.size()), out.data(), int32_t(out.size()), add_bos,
                           special);
    }
    out.resize(size_t(std::max(n, 0)));
    return out;
}

std::string Model::piece(llama_token t, bool special) const {
    char buf[128];
    int32_t n = llama_token_to_piece(vocab_, t, buf, sizeof(buf), 0, special);
    if (n >= 0) return std::string(buf, size_t(n));
    std::string big(size_t(-n), '\0');
    n = llama_token_to_piece(vocab_, t, big.data(), int32_t(big.size()), 0, special);
    big.resize(size_t(std::max(n, 0)));
    return big;
}

}  // namespace armada::engine

namespace armada::engine {

std::string Model::meta(const std::string & key) const {
    char buf[256];
    const int32_t n = llama_model_meta_val_str(model_, key.c_str(), buf, sizeof buf);
    return n < 0 ? std::string() : std::string(buf, size_t(std::min<int32_t>(n, int32_t(sizeof buf) - 1)));
}

uint64_t Model::kv_bytes_per_token(ggml_type type_k, ggml_type type_v) const {
    const int64_t n_head = std::max(1, llama_model_n_head(model_));
    const int64_t n_head_kv = std::max(1, llama_model_n_head_kv(model_));
    const std::string arch = meta("general.architecture");
    auto length = [&](const char * what, int64_t def) {
        const std::string v = meta(arch + ".attention." + what);
        try {
            return v.empty() ? def : int64_t(std::stoll(v));
        } catch (const std::exception &) {
            return def;
        }
    };
    const int64_t k_len = length("key_length", llama_model_n_embd(model_) / n_head);
    const int64_t v_len = length("value_length", k_len);
    const uint64_t per_layer =
        uint64_t(ggml_row_size(type_k, n_head_kv * k_len) + ggml_row_size(type_v, n_head_kv * v_len));
    return per_layer * uint64_t(llama_model_n_layer(model_));
}

}  // namespace armada::engine

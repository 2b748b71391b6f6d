#include "cli/mkmodel.h"

#include "sim/splitmix.h"

#include <ggml.h>
#include <gguf.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

namespace armada::cli {
namespace {

const ModelShape kShapes[] = {
    {"tiny", 2, 128, 2, 1, 256, 4096, true},
    {"small", 12, 512, 8, 2, 1536, 32768, false},
    {"0.5b", 24, 896, 14, 2, 4864, 32768, true},
    {"7b", 28, 3584, 28, 4, 18944, 32768, false},
};

struct GgufDeleter {
    void operator()(gguf_context * c) const { gguf_free(c); }
};
struct GgmlDeleter {
    void operator()(ggml_context * c) const { ggml_free(c); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufDeleter>;
using GgmlPtr = std::unique_ptr<ggml_context, GgmlDeleter>;

// Seeded and fast: weight values do not affect speed, only determinism matters.
struct Rng : sim::SplitMix64 {
    float uniform() { return float(next() >> 40) / float(1ULL << 24) * 2.0f - 1.0f; }
};

bool parse_type(const std::string & name, ggml_type & out) {
    if (name == "f16") {
        out = GGML_TYPE_F16;
        return true;
    }
    if (name == "q8_0") {
        out = GGML_TYPE_Q8_0;
        return true;
    }
    if (name == "q4_0") {
        out = GGML_TYPE_Q4_0;
        return true;
    }
    if (name == "q4_k") {
        out = GGML_TYPE_Q4_K;
        return true;
    }
    return false;
}

int file_type_of(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F16:
            return 1;  // LLAMA_FTYPE_MOSTLY_F16
        case GGML_TYPE_Q8_0:
            return 7;  // LLAMA_FTYPE_MOSTLY_Q8_0
        case GGML_TYPE_Q4_0:
            return 2;  // LLAMA_FTYPE_MOSTLY_Q4_0
        case GGML_TYPE_Q4_K:
            return 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
        default:
            return 0;
    }
}

struct TensorPlan {
    std::string name;
    int64_t ne0, ne1;  // ne1 == 1 for vectors
    ggml_type type;
    float scale;  // uniform(-scale, scale); 0 means all ones (norm weights)
};

// Matrices use the requested type when their rows fit its block; otherwise they fall back to q8_0
// or f16 the way llama-quantize does for odd-sized tensors.
ggml_type fit_type(ggml_type want, int64_t ne0) {
    if (ne0 % ggml_blck_size(want) == 0) return want;
    if (ne0 % ggml_blck_size(GGML_TYPE_Q8_0) == 0) return GGML_TYPE_Q8_0;
    return GGML_TYPE_F16;
}

std::vector<TensorPlan> plan_tensors(const ModelShape & s, int64_t n_vocab, ggml_type wtype) {
    const int64_t head_dim = s.n_embd / s.n_head;
    const int64_t n_kv = head_dim * s.n_head_kv;
    const float w = 0.08f;
    std::vector<TensorPlan> t;
    t.push_back({"token_embd.weight", s.n_embd, n_vocab, fit_type(wtype, s.n_embd), w});
    t.push_back({"output_norm.weight", s.n_embd, 1, GGML_TYPE_F32, 0});
    if (!s.tied_output) t.push_back({"output.weight", s.n_embd, n_vocab, fit_type(wtype, s.n_embd), w});
    for (int i = 0; i < s.n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        t.push_back({p + "attn_norm.weight", s.n_embd, 1, GGML_TYPE_F32, 0});
        t.push_back({p + "attn_q.weight", s.n_embd, s.n_embd, fit_type(wtype, s.n_embd), w});
        t.push_back({p + "attn_q.bias", s.n_embd, 1, GGML_TYPE_F32, 0.02f});
        t.push_back({p + "attn_k.weight", s.n_embd, n_kv, fit_type(wtype, s.n_embd), w});
        t.push_back({p + "attn_k.bias", n_kv, 1, GGML_TYPE_F32, 0.02f});
        t.push_back({p + "attn_v.weight", s.n_embd, n_kv, fit_type(wtype, s.n_embd), w});
        t.push_back({p + "attn_v.bias", n_kv, 1, GGML_TYPE_F32, 0.02f});
        t.push_back({p + "attn_output.weight", s.n_embd, s.n_embd, fit_type(wtype, s.n_embd), w});
        t.push_back({p + "ffn_norm.weight", s.n_embd, 1, GGML_TYPE_F32, 0});
        t.push_back({p + "ffn_gate.weight", s.n_embd, s.n_ff, fit_type(wtype, s.n_embd), w});
        t.push_back({p + "ffn_up.weight", s.n_embd, s.n_ff, fit_type(wtype, s.n_embd), w});
        t.push_back({p + "ffn_down.weight", s.n_ff, s.n_embd, fit_type(wtype, s.n_ff), w});
    }
    return t;
}

std::string read_file(const std::string & path, std::string & err) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        err = "cannot read " + path;
        return {};
    }
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Copies the tokenizer keys from the vocab GGUF; architecture keys are ours to set.
void copy_tokenizer(gguf_context * dst, const gguf_context * vocab) {
    gguf_set_kv(dst, vocab);
    std::vector<std::string> drop;
    for (int64_t i = 0; i < gguf_get_n_kv(dst); ++i) {
        std::string key = gguf_get_key(dst, i);
        if (key.rfind("tokenizer.", 0) != 0) drop.push_back(key);
    }
    for (const auto & k : drop)
        gguf_remove_key(dst, k.c_str());
}

void set_hparams(gguf_context * g, const ModelShape & s, ggml_type wtype) {
    gguf_set_val_str(g, "general.architecture", "qwen2");
    gguf_set_val_str(g, "general.name", ("armada-random-" + s.name).c_str());
    gguf_set_val_u32(g, "general.file_type", file_type_of(wtype));
    gguf_set_val_u32(g, "general.quantization_version", GGML_QNT_VERSION);
    gguf_set_val_u32(g, "qwen2.context_length", s.n_ctx_train);
    gguf_set_val_u32(g, "qwen2.embedding_length", s.n_embd);
    gguf_set_val_u32(g, "qwen2.block_count", s.n_layer);
    gguf_set_val_u32(g, "qwen2.feed_forward_length", s.n_ff);
    gguf_set_val_u32(g, "qwen2.attention.head_count", s.n_head);
    gguf_set_val_u32(g, "qwen2.attention.head_count_kv", s.n_head_kv);
    gguf_set_val_f32(g, "qwen2.rope.freq_base", 1000000.0f);
    gguf_set_val_f32(g, "qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
}

// Fills one tensor row by row and converts it to its type in bounded memory.
bool write_tensor_data(FILE * f, const TensorPlan & t, Rng & rng) {
    std::vector<float> row_f32(t.ne0);
    const int64_t rows_per_chunk = std::max<int64_t>(1, (1 << 20) / t.ne0);
    std::vector<float> chunk_f32;
    std::vector<uint8_t> out;
    for (int64_t r0 = 0; r0 < t.ne1; r0 += rows_per_chunk) {
        const int64_t nrows = std::min(rows_per_chunk, t.ne1 - r0);
        chunk_f32.resize(nrows * t.ne0);
        for (auto & v : chunk_f32)
            v = t.scale == 0 ? 1.0f : rng.uniform() * t.scale;
        const size_t bytes = ggml_row_size(t.type, t.ne0) * nrows;
        out.resize(bytes);
        if (t.type == GGML_TYPE_F32) {
            std::memcpy(out.data(), chunk_f32.data(), bytes);
        } else {
            ggml_quantize_chunk(t.type, chunk_f32.data(), out.data(), 0, nrows, t.ne0, nullptr);
        }
        if (fwrite(out.data(), 1, bytes, f) != bytes) return false;
    }
    return true;
}

}  // namespace

bool find_shape(const std::string & name, ModelShape & out) {
    for (const auto & s : kShapes) {
        if (s.name == name) {
            out = s;
            return true;
        }
    }
    return false;
}

std::string write_model(const MkModelOptions & opt) {
    ModelShape shape;
    if (!find_shape(opt.shape, shape)) return "unknown shape '" + opt.shape + "' (tiny, small, 0.5b, 7b)";
    ggml_type wtype;
    if (!parse_type(opt.type, wtype)) return "unknown type '" + opt.type + "' (f16, q8_0, q4_0, q4_k)";
    if (opt.output.empty()) return "an output file is required (-o FILE)";

    const std::string llama_src = ARMADA_LLAMA_SRC;
    const std::string vocab_path = opt.vocab.empty() ? llama_src + "/models/ggml-vocab-qwen2.gguf" : opt.vocab;
    const std::string tmpl_path =
        opt.template_.empty() ? llama_src + "/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja" : opt.template_;

    gguf_init_params vp{true, nullptr};
    GgufPtr vocab(gguf_init_from_file(vocab_path.c_str(), vp));
    if (!vocab) return "cannot read tokenizer GGUF " + vocab_path;
    const int64_t tok_key = gguf_find_key(vocab.get(), "tokenizer.ggml.tokens");
    if (tok_key < 0) return vocab_path + " has no tokenizer.ggml.tokens";
    const int64_t n_vocab = int64_t(gguf_get_arr_n(vocab.get(), tok_key));
    std::string err;
    const std::string tmpl = read_file(tmpl_path, err);
    if (!err.empty()) return err;

    GgufPtr out(gguf_init_empty());
    copy_tokenizer(out.get(), vocab.get());
    set_hparams(out.get(), shape, wtype);
    gguf_set_val_str(out.get(), "tokenizer.chat_template", tmpl.c_str());

    const auto plan = plan_tensors(shape, n_vocab, wtype);
    ggml_init_params ip{ggml_tensor_overhead() * (plan.size() + 8), nullptr, true};
    GgmlPtr meta(ggml_init(ip));
    for (const auto & t : plan) {
        ggml_tensor * x = t.ne1 == 1 ? ggml_new_tensor_1d(meta.get(), t.type, t.ne0)
                                     : ggml_new_tensor_2d(meta.get(), t.type, t.ne0, t.ne1);
        ggml_set_name(x, t.name.c_str());
        gguf_add_tensor(out.get(), x);
    }

    const std::string tmp_path = opt.output + ".part";
    FILE * f = fopen(tmp_path.c_str(), "wb");
    if (!f) return "cannot write " + tmp_path;
    bool ok = gguf_write_to_file_ptr(out.get(), f, /*only_meta=*/true);
    const size_t align = gguf_get_alignment(out.get());
    Rng rng{opt.seed};
    for (size_t i = 0; ok && i < plan.size(); ++i) {
        ok = write_tensor_data(f, plan[i], rng);
        const size_t sz = gguf_get_tensor_size(out.get(), int64_t(i));
        const size_t pad = (align - sz % align) % align;
        static const char zeros[64] = {};
        ok = ok && fwrite(zeros, 1, pad, f) == pad;
    }
    ok = (fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp_path.c_str(), opt.output.c_str()) != 0) {
        std::remove(tmp_path.c_str());
        return "failed writing " + opt.output;
    }
    return {};
}

}  // namespace armada::cli

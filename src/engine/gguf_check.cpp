#include "engine/gguf_check.h"

#include <gguf.h>

#include <memory>

namespace armada::engine {

namespace {
struct GgufDeleter {
    void operator()(gguf_context * c) const { gguf_free(c); }
};

// Reads an unsigned integer key of any width; false when missing or not an integer.
bool get_uint(const gguf_context * g, const std::string & key, uint64_t & out) {
    const int64_t id = gguf_find_key(g, key.c_str());
    if (id < 0) return false;
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_UINT8:
            out = gguf_get_val_u8(g, id);
            return true;
        case GGUF_TYPE_UINT16:
            out = gguf_get_val_u16(g, id);
            return true;
        case GGUF_TYPE_UINT32:
            out = gguf_get_val_u32(g, id);
            return true;
        case GGUF_TYPE_UINT64:
            out = gguf_get_val_u64(g, id);
            return true;
        case GGUF_TYPE_INT32: {
            const int32_t v = gguf_get_val_i32(g, id);
            out = v < 0 ? UINT64_MAX : uint64_t(v);
            return true;
        }
        default:
            return false;
    }
}
}  // namespace

std::string check_gguf(const std::string & path) {
    gguf_init_params p{true, nullptr};
    std::unique_ptr<gguf_context, GgufDeleter> g(gguf_init_from_file(path.c_str(), p));
    if (!g) return "not a readable GGUF file (bad magic, version, counts or string lengths)";
    const int64_t arch_id = gguf_find_key(g.get(), "general.architecture");
    if (arch_id < 0 || gguf_get_kv_type(g.get(), arch_id) != GGUF_TYPE_STRING) {
        return "general.architecture is missing";
    }
    const std::string arch = gguf_get_val_str(g.get(), arch_id);
    // llama.cpp asserts 0 < n_layer <= LLAMA_MAX_LAYERS (512) instead of failing the load.
    uint64_t layers = 0;
    if (get_uint(g.get(), arch + ".block_count", layers) && (layers == 0 || layers > 512)) {
        return arch + ".block_count is " + std::to_string(layers) + "; llama.cpp supports 1 to 512 layers";
    }
    return {};
}

}  // namespace armada::engine

// KV files read back from disk: the journal (records folded into a state), the sequence-state
// layout it cuts and joins, and the pool's spill files. Any bytes must give a state or a reason.
#include "engine/kv_journal.h"
#include "engine/kv_pool.h"
#include "engine/kv_state.h"

#include <cstdlib>

using namespace armada::engine;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string image(reinterpret_cast<const char *>(data), size);
    std::string why;
    if (auto b = KvJournal::read_image(image, "fp-1", "k", why)) {
        if (auto l = SeqState::parse(b->data.data(), b->data.size(), why)) {
            if (l->cell_count() != b->tokens.size()) std::abort();
        }
    }
    why.clear();
    if (auto l = SeqState::parse(data, size, why)) {
        // Cutting and joining back must give the same cells.
        const int32_t mid = l->positions().empty() ? 0 : l->positions()[l->positions().size() / 2];
        auto a = l->select(data, INT32_MIN, mid), b = l->select(data, mid, INT32_MAX);
        auto la = SeqState::parse(a.data(), a.size(), why), lb = SeqState::parse(b.data(), b.size(), why);
        if (la && lb) {
            auto j = SeqState::join(a.data(), *la, b.data(), *lb);
            std::string w;
            auto lj = SeqState::parse(j.data(), j.size(), w);
            if (!lj || lj->cell_count() != l->cell_count()) std::abort();
        }
    } else if (why.empty()) {
        std::abort();  // a refusal always says why
    }
    KvPool::decode_file(image, "fp-1", "k", why);
    return 0;
}

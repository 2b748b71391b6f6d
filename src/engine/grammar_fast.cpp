#include "engine/grammar_fast.h"

#include <cctype>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

namespace armada::engine {

const VocabIndex & VocabIndex::of(const Model & m) {
    static std::mutex mu;
    static std::map<const Model *, std::unique_ptr<VocabIndex>> cache;
    std::lock_guard lk(mu);
    auto & slot = cache[&m];
    if (!slot) {
        auto ix = std::make_unique<VocabIndex>();
        ix->byte_token.fill(LLAMA_TOKEN_NULL);
        for (llama_token t = 0; t < m.n_vocab(); ++t) {
            // The text llama.cpp's grammar sees: the piece with special tokens rendered.
            const std::string piece = m.piece(t, true);
            if (piece.empty() || m.is_eog(t)) {
                ix->always.push_back(t);
                if (piece.empty()) continue;
            }
            const auto b = static_cast<uint8_t>(piece[0]);
            ix->by_first_byte[b].push_back(t);
            if (piece.size() == 1 && ix->byte_token[b] == LLAMA_TOKEN_NULL) ix->byte_token[b] = t;
        }
        slot = std::move(ix);
    }
    return *slot;
}

GrammarFast::GrammarFast(const Model & model, const std::string & grammar, const std::string & prefill,
                         FastSamplerParams p)
    : model_(model), index_(VocabIndex::of(model)), fast_(std::move(p)) {
    grammar_ = llama_sampler_init_grammar(model.vocab(), grammar.c_str(), "root");
    if (!grammar_) throw std::invalid_argument("llama.cpp rejected the grammar");
    // The grammar's root begins with the text the template already put in the prompt (the
    // assistant header); move the grammar past it, as llama.cpp's common sampler does.
    if (!prefill.empty()) {
        const Tokens toks = model.tokenize(prefill, false, true);
        for (size_t i = 0; i < toks.size(); ++i) {
            const std::string piece = model.piece(toks[i], true);
            if (i == 0 && !piece.empty() && std::isspace(static_cast<unsigned char>(piece[0])) &&
                !std::isspace(static_cast<unsigned char>(prefill[0]))) {
                continue;
            }
            if (!accept(toks[i])) {
                llama_sampler_free(grammar_);
                grammar_ = nullptr;
                throw std::invalid_argument("the grammar does not accept the generation prompt");
            }
        }
    }
}

GrammarFast::~GrammarFast() {
    if (grammar_) llama_sampler_free(grammar_);
}

bool GrammarFast::fits(llama_token t) {
    llama_token_data d{t, 0.0f, 0.0f};
    llama_token_data_array a{&d, 1, -1, false};
    llama_sampler_apply(grammar_, &a);
    return d.logit != -INFINITY;
}

bool GrammarFast::accept(llama_token t) {
    try {
        llama_sampler_accept(grammar_, t);
        return true;
    } catch (const std::exception &) {
        return false;
    }
}

std::array<bool, 256> GrammarFast::allowed_first_bytes() {
    std::array<bool, 256> allowed{};
    cand_.clear();
    for (int b = 0; b < 256; ++b) {
        if (index_.byte_token[size_t(b)] == LLAMA_TOKEN_NULL) {
            allowed[size_t(b)] = true;  // cannot ask; keep its tokens
        } else {
            cand_.push_back({index_.byte_token[size_t(b)], 0.0f, 0.0f});
        }
    }
    llama_token_data_array probe{cand_.data(), cand_.size(), -1, false};
    llama_sampler_apply(grammar_, &probe);
    for (const auto & c : cand_) {
        if (c.logit != -INFINITY) allowed[static_cast<uint8_t>(model_.piece(c.id, true)[0])] = true;
    }
    return allowed;
}

int GrammarFast::only_next_byte() {
    for (llama_token t : index_.always) {
        if (model_.is_eog(t) && fits(t)) return -1;  // the output may end here
    }
    const auto allowed = allowed_first_bytes();
    int only = -1;
    for (int b = 0; b < 256; ++b) {
        if (!allowed[size_t(b)]) continue;
        if (only >= 0) return -1;
        only = b;
    }
    // A byte with no one-byte token was not asked about: it is not known to be the only one.
    return only >= 0 && index_.byte_token[size_t(only)] != LLAMA_TOKEN_NULL ? only : -1;
}

std::string GrammarFast::forced(size_t max_bytes) {
    std::string out;
    while (out.size() < max_bytes) {
        const int b = only_next_byte();
        // ASCII only: the caller tokenizes the text, and a lone byte of a multi-byte character
        // does not tokenize back to itself.
        if (b < 0 || b >= 0x80 || !accept(index_.byte_token[size_t(b)])) break;
        out += char(b);
    }
    return out;
}

llama_token GrammarFast::sample(const float * logits, int32_t n_vocab) {
    // Most tokens of a model trained on the format fit at once.
    const llama_token first = fast_.sample(logits, n_vocab);
    if (fits(first)) return first;
    ++fallbacks_;

    // Which first bytes may come next? Then the grammar over the tokens that can still fit.
    const auto allowed = allowed_first_bytes();
    cand_.clear();
    for (int b = 0; b < 256; ++b) {
        if (!allowed[size_t(b)]) continue;
        for (llama_token t : index_.by_first_byte[size_t(b)])
            cand_.push_back({t, logits[t], 0.0f});
    }
    for (llama_token t : index_.always)
        cand_.push_back({t, logits[t], 0.0f});
    llama_token_data_array arr{cand_.data(), cand_.size(), -1, false};
    llama_sampler_apply(grammar_, &arr);
    masked_.assign(size_t(n_vocab), -INFINITY);
    bool any = false;
    for (const auto & c : cand_) {
        if (c.logit == -INFINITY) continue;
        masked_[size_t(c.id)] = logits[c.id];
        any = true;
    }
    if (!any) return first;  // the grammar allows nothing; accept() will say so
    return fast_.sample(masked_.data(), n_vocab);
}

}  // namespace armada::engine

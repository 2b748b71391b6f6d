#include "engine/kv_state.h"

#include <cstring>

namespace armada::engine {

namespace {

class Reader {
  public:
    Reader(const uint8_t * d, size_t n) : d_(d), n_(n) {}
    template <class T>
    bool get(T & v) {
        if (n_ - off_ < sizeof(T)) return false;
        std::memcpy(&v, d_ + off_, sizeof(T));
        off_ += sizeof(T);
        return true;
    }
    bool skip(uint64_t n) {
        if (n > n_ - off_) return false;
        off_ += size_t(n);
        return true;
    }
    size_t off() const { return off_; }
    size_t left() const { return n_ - off_; }

  private:
    const uint8_t * d_;
    size_t n_;
    size_t off_ = 0;
};

template <class T>
void put(std::vector<uint8_t> & out, T v) {
    const auto * p = reinterpret_cast<const uint8_t *>(&v);
    out.insert(out.end(), p, p + sizeof(T));
}

constexpr size_t kMetaBytes = 12;             // pos, n_seq_id, seq_id
constexpr uint32_t kStateMagic = 0xaf143cd8;  // llama.cpp's sequence state magic

}  // namespace

std::optional<SeqState> SeqState::parse(const uint8_t * data, size_t n, std::string & why) {
    SeqState st;
    Reader r(data, n);
    if (!r.get(st.magic_) || st.magic_ != kStateMagic || !r.get(st.seq_)) {
        why = "not a llama.cpp sequence state";
        return std::nullopt;
    }
    if (!r.get(st.n_stream_) || st.n_stream_ == 0 || st.n_stream_ > 4096) {
        why = "bad stream count";
        return std::nullopt;
    }
    bool found = false;
    for (uint32_t s = 0; s < st.n_stream_; ++s) {
        uint32_t cells = 0;
        if (!r.get(cells)) {
            why = "truncated";
            return std::nullopt;
        }
        if (cells == 0) continue;
        if (found) {
            why = "cells in more than one stream";
            return std::nullopt;
        }
        found = true;
        st.stream_ = s;
        st.cell_count_ = cells;
        if (uint64_t(cells) * kMetaBytes > r.left()) {
            why = "truncated cell records";
            return std::nullopt;
        }
        st.runs_.push_back({r.off(), kMetaBytes, true});
        st.pos_.resize(cells);
        for (uint32_t i = 0; i < cells; ++i) {
            int32_t pos = 0, seq = 0;
            uint32_t n_seq = 0;
            r.get(pos);
            r.get(n_seq);
            r.get(seq);
            if (n_seq != 1) {
                why = "cell record is not for exactly one sequence";
                return std::nullopt;
            }
            st.pos_[i] = pos;
        }
        uint32_t v_trans = 0, n_layer = 0;
        const size_t hdr = r.off();
        if (!r.get(v_trans) || !r.get(n_layer) || v_trans > 1 || n_layer == 0 || n_layer > 4096) {
            why = "bad layer header";
            return std::nullopt;
        }
        st.runs_.push_back({hdr, 8, false});
        // One layer of rows: type, row size, then one row per cell (K, and V when not transposed).
        auto rows = [&](const char * what) {
            const size_t h = r.off();
            int32_t type = 0;
            uint64_t row = 0;
            if (!r.get(type) || !r.get(row) || row == 0 || row > (1u << 24)) {
                why = std::string("bad ") + what + " layer";
                return false;
            }
            st.runs_.push_back({h, 12, false});
            st.runs_.push_back({r.off(), size_t(row), true});
            if (!r.skip(row * cells)) {
                why = std::string("truncated ") + what + " data";
                return false;
            }
            return true;
        };
        for (uint32_t l = 0; l < n_layer; ++l) {
            if (!rows("K")) return std::nullopt;
        }
        for (uint32_t l = 0; l < n_layer; ++l) {
            if (!v_trans) {
                if (!rows("V")) return std::nullopt;
            } else {  // transposed V: for each embedding element, one entry per cell
                const size_t h = r.off();
                int32_t type = 0;
                uint32_t el = 0, n_embd = 0;
                if (!r.get(type) || !r.get(el) || !r.get(n_embd) || el == 0 || el > 16 || n_embd == 0 ||
                    n_embd > (1u << 20)) {
                    why = "bad V layer";
                    return std::nullopt;
                }
                st.runs_.push_back({h, 12, false});
                for (uint32_t j = 0; j < n_embd; ++j) {
                    st.runs_.push_back({r.off(), el, true});
                    if (!r.skip(uint64_t(el) * cells)) {
                        why = "truncated V data";
                        return std::nullopt;
                    }
                }
            }
        }
    }
    if (!found) {
        why = "no cells";
        return std::nullopt;
    }
    if (r.left() != 0) {
        why = "trailing bytes (unknown layout)";
        return std::nullopt;
    }
    return st;
}

namespace {

// Writes the stream count and cell counts around one stream's body.
void write_streams(std::vector<uint8_t> & out, uint32_t magic, int32_t seq, uint32_t n_stream, uint32_t stream,
                   uint32_t cells) {
    put(out, magic);
    put(out, seq);
    put(out, n_stream);
    for (uint32_t s = 0; s < stream; ++s)
        put(out, uint32_t(0));
    put(out, cells);
}

void write_tail(std::vector<uint8_t> & out, uint32_t n_stream, uint32_t stream) {
    for (uint32_t s = stream + 1; s < n_stream; ++s)
        put(out, uint32_t(0));
}

}  // namespace

std::vector<uint8_t> SeqState::select(const uint8_t * data, int32_t p0, int32_t p1) const {
    std::vector<uint32_t> keep;
    for (uint32_t i = 0; i < cell_count_; ++i) {
        if (pos_[i] >= p0 && pos_[i] < p1) keep.push_back(i);
    }
    std::vector<uint8_t> out;
    write_streams(out, magic_, seq_, n_stream_, stream_, uint32_t(keep.size()));
    if (keep.empty()) {
        // An empty stream has no body.
        write_tail(out, n_stream_, stream_);
        return out;
    }
    for (const Run & run : runs_) {
        if (!run.per_cell) {
            out.insert(out.end(), data + run.off, data + run.off + run.len);
            continue;
        }
        // Consecutive cells are copied as one block: a sequence's cells are mostly contiguous.
        for (size_t k = 0; k < keep.size();) {
            size_t j = k + 1;
            while (j < keep.size() && keep[j] == keep[j - 1] + 1)
                ++j;
            const uint8_t * e = data + run.off + size_t(keep[k]) * run.len;
            out.insert(out.end(), e, e + run.len * (j - k));
            k = j;
        }
    }
    write_tail(out, n_stream_, stream_);
    return out;
}

std::vector<uint8_t> SeqState::join(const uint8_t * a, const SeqState & la, const uint8_t * b, const SeqState & lb) {
    // The stream a state was saved from does not matter: a restore puts the cells into the stream of
    // the sequence it restores into.
    if (la.n_stream_ != lb.n_stream_ || la.runs_.size() != lb.runs_.size()) return {};
    for (size_t k = 0; k < la.runs_.size(); ++k) {
        const Run & x = la.runs_[k];
        const Run & y = lb.runs_[k];
        if (x.per_cell != y.per_cell || x.len != y.len) return {};
        if (!x.per_cell && std::memcmp(a + x.off, b + y.off, x.len) != 0) return {};
    }
    std::vector<uint8_t> out;
    write_streams(out, la.magic_, la.seq_, la.n_stream_, la.stream_, la.cell_count_ + lb.cell_count_);
    for (size_t k = 0; k < la.runs_.size(); ++k) {
        const Run & x = la.runs_[k];
        const Run & y = lb.runs_[k];
        if (!x.per_cell) {
            out.insert(out.end(), a + x.off, a + x.off + x.len);
            continue;
        }
        out.insert(out.end(), a + x.off, a + x.off + x.len * la.cell_count_);
        out.insert(out.end(), b + y.off, b + y.off + y.len * lb.cell_count_);
    }
    write_tail(out, la.n_stream_, la.stream_);
    return out;
}

}  // namespace armada::engine

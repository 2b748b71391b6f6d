#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace armada::engine {

//! The layout of one sequence's saved KV (`llama_state_seq_get_data`), as far as Armada needs it
//! to cut and join saved states by position.
//!
//! The image is: llama.cpp's magic and the source sequence id; the stream count; per stream a cell count and, for the
//! one stream that holds cells, a meta record per cell (position, seq count 1, seq id) followed by per-layer K and V
//! data in which every array has one entry per cell. Cutting keeps the same entry of every
//! array; joining appends one image's entries after the other's. The format belongs to the
//! llama.cpp build, which is part of the KV fingerprint, so an image is only ever read by the
//! build that wrote it. Anything that does not parse exactly (other layouts, per-cell extras of
//! M-RoPE models, missing V layers) is rejected and the caller falls back to whole images.
class SeqState {
  public:
    //! Parses an image. On failure returns nullopt and says why.
    static std::optional<SeqState> parse(const uint8_t * data, size_t n, std::string & why);

    uint32_t cell_count() const { return cell_count_; }
    const std::vector<int32_t> & positions() const { return pos_; }

    //! An image holding only the cells whose position is in [p0, p1).
    std::vector<uint8_t> select(const uint8_t * data, int32_t p0, int32_t p1) const;

    //! Joins two images of the same layout: the cells of `a` then those of `b`. Returns an empty
    //! vector when the layouts differ (another model, stream or cache type).
    static std::vector<uint8_t> join(const uint8_t * a, const SeqState & la, const uint8_t * b, const SeqState & lb);

  private:
    // A run of the image: either fixed bytes copied as they are, or an array with one `unit`-byte
    // entry per cell.
    struct Run {
        size_t off = 0;
        size_t len = 0;  // fixed: bytes; per cell: bytes per entry
        bool per_cell = false;
    };

    uint32_t magic_ = 0;
    int32_t seq_ = 0;
    uint32_t n_stream_ = 0, stream_ = 0, cell_count_ = 0;
    std::vector<int32_t> pos_;
    std::vector<Run> runs_;  // everything after the stream's cell count
};

}  // namespace armada::engine

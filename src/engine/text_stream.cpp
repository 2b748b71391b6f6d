#include "engine/text_stream.h"

#include "text/utf8.h"

#include <algorithm>

namespace armada::engine {

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string & s) { return s.empty(); });
}

size_t TextStream::holdback() const {
    // The longest suffix of pending_ that is a proper prefix of some stop string.
    size_t keep = 0;
    for (const auto & stop : stops_) {
        const size_t max_len = std::min(stop.size() - 1, pending_.size());
        for (size_t len = max_len; len > keep; --len) {
            if (pending_.compare(pending_.size() - len, len, stop, 0, len) == 0) {
                keep = len;
                break;
            }
        }
    }
    return std::max(keep, text::utf8_incomplete_tail(pending_));
}

std::string TextStream::push(std::string_view piece) {
    if (stopped_) return {};
    const size_t search_from = pending_.size();
    pending_.append(piece);
    size_t cut = std::string::npos;
    for (const auto & stop : stops_) {
        // A match can start up to stop.size()-1 bytes before the new piece.
        const size_t from = search_from >= stop.size() ? search_from - stop.size() + 1 : 0;
        const size_t pos = pending_.find(stop, from);
        if (pos != std::string::npos) cut = std::min(cut, pos);
    }
    if (cut != std::string::npos) {
        stopped_ = true;
        std::string out = text::utf8_sanitize(std::string_view(pending_).substr(0, cut));
        pending_.clear();
        return out;
    }
    const size_t keep = holdback();
    std::string out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return text::utf8_sanitize(out);
}

std::string TextStream::finish() {
    if (stopped_) return {};
    std::string out = text::utf8_sanitize(pending_);
    pending_.clear();
    return out;
}

}  // namespace armada::engine

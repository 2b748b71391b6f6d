#include "net/sse.h"

namespace armada::net {

namespace {
void append_field(std::string & out, std::string_view name, std::string_view value) {
    out += name;
    out += ": ";
    for (char c : value) {
        if (c != '\r' && c != '\n') out += c;
    }
    out += '\n';
}
}  // namespace

std::string sse_event(std::string_view event, std::string_view data, std::string_view id) {
    std::string out;
    out.reserve(data.size() + event.size() + id.size() + 32);
    if (!id.empty()) append_field(out, "id", id);
    if (!event.empty()) append_field(out, "event", event);
    out += "data: ";
    for (size_t i = 0; i < data.size(); ++i) {
        const char c = data[i];
        if (c == '\r' || c == '\n') {
            if (c == '\r' && i + 1 < data.size() && data[i + 1] == '\n') ++i;
            out += "\ndata: ";
        } else {
            out += c;
        }
    }
    out += "\n\n";
    return out;
}

std::vector<std::string_view> data_lines(std::string_view data) {
    std::vector<std::string_view> out;
    for (size_t at = 0;;) {
        const size_t nl = data.find('\n', at);
        out.push_back(data.substr(at, nl == std::string_view::npos ? nl : nl - at));
        if (nl == std::string_view::npos) return out;
        at = nl + 1;
    }
}

const std::string & SseEvent::type() const {
    static const std::string message = "message";
    return event.empty() ? message : event;
}

bool SseReader::feed(std::string_view bytes, const Handler & fn) {
    if (failed_) return false;
    buf_.append(bytes);
    if (!bom_checked_) {
        static constexpr std::string_view bom = "\xEF\xBB\xBF";
        if (buf_.size() < bom.size() && bom.substr(0, buf_.size()) == buf_) return true;
        if (std::string_view(buf_).substr(0, bom.size()) == bom) buf_.erase(0, bom.size());
        bom_checked_ = true;
    }
    const bool go = scan(fn);
    compact();
    if (go && buf_.size() > opt_.max_block) {
        failed_ = true;
        return false;
    }
    return go;
}

bool SseReader::scan(const Handler & fn) {
    for (;;) {
        const size_t eol = buf_.find_first_of("\r\n", scanned_);
        if (eol == std::string::npos) return true;
        size_t next = eol + 1;
        if (buf_[eol] == '\r') {
            if (eol + 1 == buf_.size()) return true;  // a LF may follow in the next chunk
            if (buf_[eol + 1] == '\n') next = eol + 2;
        }
        const std::string_view text(buf_.data() + scanned_, eol - scanned_);
        scanned_ = next;
        if (!line(text, next, fn)) return false;
    }
}

void SseReader::compact() {
    // Once per call, not per event: a body of many small events costs one pass over it.
    if (block_ > 0) moved_ += buf_.size() - block_;
    buf_.erase(0, block_);
    scanned_ -= block_;
    block_ = 0;
}

bool SseReader::finish(const Handler & fn) {
    if (failed_) return false;
    bom_checked_ = true;
    if (!scan(fn)) {
        compact();
        return false;
    }
    if (scanned_ < buf_.size()) {
        // The last line, never ended (a lone CR at the very end is its end).
        size_t end = buf_.size();
        if (buf_.back() == '\r') --end;
        const std::string_view text(buf_.data() + scanned_, end - scanned_);
        scanned_ = buf_.size();
        if (!line(text, scanned_, fn)) {
            compact();
            return false;
        }
    }
    bool go = true;
    if (block_ < buf_.size()) go = dispatch(buf_.size(), fn);
    compact();
    return go;
}

bool SseReader::line(std::string_view text, size_t end, const Handler & fn) {
    if (text.empty()) return dispatch(end, fn);
    if (text.front() == ':') return true;  // a comment
    const size_t colon = text.find(':');
    const std::string_view field = text.substr(0, colon);
    std::string_view value;
    if (colon != std::string_view::npos) {
        value = text.substr(colon + 1);
        if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    }
    if (field == "event") {
        cur_.event = value;
    } else if (field == "data") {
        cur_.data.append(value);
        cur_.data += '\n';
        cur_.has_data = true;
    } else if (field == "id") {
        if (value.find('\0') == std::string_view::npos) {
            cur_.id = value;
            cur_.has_id = true;
        }
    }
    return true;  // `retry` and unknown fields are ignored
}

bool SseReader::dispatch(size_t end, const Handler & fn) {
    const bool pass = cur_.has_data || opt_.every_block;
    bool go = true;
    if (pass) {
        if (cur_.has_data) cur_.data.pop_back();  // the LF after the last data line
        cur_.raw.assign(buf_, block_, end - block_);
        go = fn(cur_);
    }
    block_ = end;
    cur_ = SseEvent{};
    return go;
}

}  // namespace armada::net

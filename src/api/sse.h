#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace armada::api {

//! One Server-Sent Events message. `data` may hold line breaks (CR, LF or CRLF): each line
//! becomes its own `data:` field, so a reader joins them back with LF. Line breaks in `event`
//! would end the field early and are dropped. An empty `event` is a plain `message`; an empty
//! `id` sends none.
inline std::string sse_event(std::string_view event, std::string_view data, std::string_view id = {}) {
    std::string out;
    out.reserve(data.size() + event.size() + 32);
    if (!id.empty()) {
        out += "id: ";
        for (char c : id) {
            if (c != '\r' && c != '\n') out += c;
        }
        out += '\n';
    }
    if (!event.empty()) {
        out += "event: ";
        for (char c : event) {
            if (c != '\r' && c != '\n') out += c;
        }
        out += '\n';
    }
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

}  // namespace armada::api

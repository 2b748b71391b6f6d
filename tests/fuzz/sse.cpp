// The SSE writer and reader (net/sse.h): whatever event name, data and id are written, in chunks
// of any size, the reader gets them back (line breaks in data as LF). On any bytes, the reader
// neither crashes nor passes on an event that lacks data, and, passing every block, hands back
// every byte it consumed as some block's `raw`.
#include "net/sse.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size < 2) return 0;
    const size_t split = data[0] % size;
    const size_t chunk = 1 + data[1] % 16;
    const std::string_view rest(reinterpret_cast<const char *>(data + 2), size - 2);
    const std::string_view event = rest.substr(0, std::min(split, rest.size()));
    const std::string_view payload = rest.substr(std::min(split, rest.size()));

    std::string want_event;
    for (char c : event) {
        if (c != '\r' && c != '\n') want_event += c;
    }
    // A name the writer cannot carry whole: a leading space is read as the separator's.
    const bool exact_event = want_event.empty() || want_event[0] != ' ';
    if (want_event.empty()) want_event = "message";
    std::string want_data;
    for (size_t i = 0; i < payload.size(); ++i) {
        if (payload[i] == '\r' && i + 1 < payload.size() && payload[i + 1] == '\n') continue;
        want_data += payload[i] == '\r' ? '\n' : payload[i];
    }

    const std::string wire = armada::net::sse_event(event, payload, "42");
    int seen = 0;
    armada::net::SseReader p;
    const armada::net::SseReader::Handler check = [&](armada::net::SseEvent & ev) {
        ++seen;
        if ((exact_event && ev.type() != want_event) || ev.data != want_data) std::abort();
        if (!ev.has_id || ev.id != "42" || ev.raw != wire) std::abort();
        return true;
    };
    for (size_t at = 0; at < wire.size(); at += chunk)
        p.feed(std::string_view(wire).substr(at, chunk), check);
    p.finish(check);
    if (seen != 1) std::abort();

    // The reader on raw bytes: any input, no crash, no event without data.
    armada::net::SseReader any;
    const armada::net::SseReader::Handler no_empty = [](armada::net::SseEvent & ev) {
        if (!ev.has_data) std::abort();
        return true;
    };
    for (size_t at = 0; at < rest.size(); at += chunk)
        any.feed(rest.substr(at, chunk), no_empty);
    any.finish(no_empty);

    // Every block passed on: the raws put together are the input (less a leading BOM).
    armada::net::SseReader all({.every_block = true});
    std::string joined;
    const armada::net::SseReader::Handler keep = [&](armada::net::SseEvent & ev) {
        joined += ev.raw;
        return true;
    };
    for (size_t at = 0; at < rest.size(); at += chunk)
        all.feed(rest.substr(at, chunk), keep);
    all.finish(keep);
    std::string_view in = rest;
    if (in.substr(0, 3) == "\xEF\xBB\xBF") in.remove_prefix(3);
    if (joined != in) std::abort();
    return 0;
}

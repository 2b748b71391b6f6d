// The SSE writer (api/sse.h) and reader (bench's SseParser): whatever event name and data are
// written, in chunks of any size, the reader gets them back (line breaks as LF).
#include "api/sse.h"
#include "bench/http_client.h"

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
    if (want_event.empty()) want_event = "message";
    std::string want_data;
    for (size_t i = 0; i < payload.size(); ++i) {
        if (payload[i] == '\r' && i + 1 < payload.size() && payload[i + 1] == '\n') continue;
        want_data += payload[i] == '\r' ? '\n' : payload[i];
    }

    const std::string wire = armada::api::sse_event(event, payload, "42");
    int seen = 0;
    armada::bench::SseParser p([&](const std::string & ev, const std::string & d) {
        ++seen;
        if (ev != want_event || d != want_data) std::abort();
        return true;
    });
    for (size_t at = 0; at < wire.size(); at += chunk)
        p.feed(std::string_view(wire).substr(at, chunk));
    if (seen != 1) std::abort();

    // The reader on raw bytes: any input, no crash.
    armada::bench::SseParser any([](const std::string &, const std::string &) { return true; });
    any.feed(rest);
    return 0;
}

// The small parsers at the edge: Last-Event-ID, query strings, durations, KV cache types, URLs,
// the Location of a redirect and W3C traceparent. None may crash, and what they accept must be
// consistent.
#include "agent/session_manager.h"
#include "api/http_server.h"
#include "cli/serve.h"
#include "engine/engine.h"
#include "net/url.h"
#include "obs/trace.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string text(reinterpret_cast<const char *>(data), size);
    if (auto id = armada::agent::EventId::parse(text)) {
        // An id that parses prints back to a form that parses to the same id.
        auto again = armada::agent::EventId::parse(id->text());
        if (!again || *again != *id) std::abort();
    }
    armada::api::HttpRequest req;
    req.query = text;
    (void)req.param("tenant");
    (void)req.param("last_event_id");
    (void)armada::cli::parse_duration_ms(text);
    (void)armada::engine::parse_cache_type(text);
    armada::net::Url base;
    if (armada::net::parse_url("http://127.0.0.1:8080/a/b?c", base)) {
        const std::string next = armada::net::resolve_location(base, text);
        armada::net::Url u;
        if (armada::net::parse_url(next, u) && armada::net::same_origin(base, u) && u.port != base.port) std::abort();
    }
    if (auto tc = armada::obs::TraceContext::parse(text)) {
        // A context that parses is valid and prints back to a header that parses to the same ids.
        auto again = armada::obs::TraceContext::parse(tc->traceparent());
        if (!tc->valid() || !again || again->trace_id != tc->trace_id || again->span_id != tc->span_id ||
            again->sampled != tc->sampled)
            std::abort();
    }
    armada::net::Url any;
    if (armada::net::parse_url(text, any) && any.host.empty()) std::abort();
    return 0;
}

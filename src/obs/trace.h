#pragma once

// Traces in the OpenTelemetry model, exported as OTLP/HTTP JSON. A span is a value the caller
// fills and hands to the tracer when it ends; the tracer queues it (bounded: a full queue drops
// and counts) and a thread of its own posts batches to the collector, so nothing on a request's
// path waits on the network. W3C trace context (`traceparent`) links spans across processes.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

namespace armada::obs {

class Registry;
class Counter;

//! A position in a trace: ids as lower-case hex (32 and 16 digits), as `traceparent` carries them.
struct TraceContext {
    std::string trace_id;
    std::string span_id;
    bool sampled = true;

    bool valid() const { return trace_id.size() == 32 && span_id.size() == 16; }
    //! `00-<trace>-<span>-<flags>`; empty when not valid.
    std::string traceparent() const;
    //! A W3C `traceparent` header; nullopt when malformed (unknown versions are read by their
    //! first four fields, as the spec asks; all-zero ids are invalid).
    static std::optional<TraceContext> parse(std::string_view header);
    //! The `"traceparent":"…"` member of compact JSON (a session row's record), if any.
    static std::optional<TraceContext> in_record(std::string_view json_text);
};

//! Fresh random ids, never all zero.
std::string new_trace_id();
std::string new_span_id();

enum class SpanKind { internal = 1, server = 2, client = 3, producer = 4, consumer = 5 };

using AttrValue = std::variant<std::string, int64_t, double, bool>;

//! One finished or running operation.
struct Span {
    TraceContext ctx;       // this span's ids
    std::string parent_id;  // empty for a root
    std::string name;
    SpanKind kind = SpanKind::internal;
    int64_t start_ns = 0;  // Unix epoch
    int64_t end_ns = 0;
    std::vector<std::pair<std::string, AttrValue>> attrs;
    bool error = false;
    std::string status_message;

    //! A span that starts now: a child of `parent` when it is valid, else the root of a new trace.
    static Span start(std::string name, SpanKind kind, const std::optional<TraceContext> & parent);
    void set(std::string key, AttrValue v);
    void fail(std::string message) {
        error = true;
        status_message = std::move(message);
    }
    //! The HTTP status a request got (`http.response.status_code`). As OpenTelemetry's HTTP
    //! conventions say, a 5xx is an error of any span, a 4xx only of a client's (the caller's
    //! mistake is not the server's failure). 0: none known (nothing is set).
    void http_status(int status);
    //! What a callee carries forward as its parent.
    const TraceContext & context() const { return ctx; }
};

int64_t unix_now_ns();

//! Spans as one OTLP `ExportTraceServiceRequest` in its JSON form.
std::string otlp_json(const std::vector<Span> & spans, const std::string & service_name,
                      const std::vector<std::pair<std::string, AttrValue>> & resource = {});

//! Posts one OTLP/HTTP body; returns an empty string on a 2xx, else why not.
using OtlpPost = std::function<std::string(const std::string & body)>;

//! Queues ended spans and exports them in batches from a thread of its own.
class Tracer {
  public:
    struct Options {
        std::string service_name = "armada";
        std::vector<std::pair<std::string, AttrValue>> resource;  // service.instance.id, …
        size_t max_queue = 4096;                                  // spans held while the collector is slow or away
        size_t max_batch = 256;
        int flush_ms = 1000;
    };
    //! `post` null: disabled; spans are built (their ids still propagate) but never kept.
    Tracer(Options o, OtlpPost post, Registry * metrics = nullptr);
    ~Tracer();
    Tracer(const Tracer &) = delete;
    Tracer & operator=(const Tracer &) = delete;

    bool enabled() const { return static_cast<bool>(post_); }
    //! Ends `s` now (if it has no end yet) and queues it. Never blocks on the network.
    void end(Span s);
    //! Exports what is queued before returning, waiting at most `max_ms` (shutdown must not hang
    //! on a collector that does not answer).
    void flush(int max_ms = 5000);

    //! Counts exported and dropped spans in `m` from now on (a process makes its registry after
    //! its tracer); what was counted before is added at once. Counting stops when the returned
    //! handle goes: keep it no longer than `m` lives.
    [[nodiscard]] std::shared_ptr<void> count_in(Registry & m);

    uint64_t exported() const { return exported_.load(); }
    uint64_t dropped() const { return dropped_.load(); }

  private:
    void run();

    Options o_;
    OtlpPost post_;
    std::atomic<Counter *> exported_metric_{nullptr}, dropped_metric_{nullptr};
    std::mutex mu_;
    std::condition_variable cv_, idle_cv_;
    std::deque<Span> queue_;
    bool stop_ = false, flush_asked_ = false, sending_ = false;
    std::atomic<uint64_t> exported_{0}, dropped_{0};
    std::thread thread_;
    std::shared_ptr<void> metrics_binding_;  // the constructor's registry, if given; last: it locks mu_
};

//! The process's tracer: a disabled one until `set_tracer` installs another.
std::shared_ptr<Tracer> tracer();
void set_tracer(std::shared_ptr<Tracer> t);

}  // namespace armada::obs

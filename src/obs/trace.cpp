#include "obs/trace.h"

#include "obs/metrics.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <random>

namespace armada::obs {
namespace {

using json = nlohmann::json;

std::string random_hex(size_t digits) {
    static const char hex[] = "0123456789abcdef";
    thread_local std::mt19937_64 rng(std::random_device{}());
    for (;;) {
        std::string s;
        s.reserve(digits);
        while (s.size() < digits) {
            uint64_t r = rng();
            for (int i = 0; i < 16 && s.size() < digits; ++i, r >>= 4)
                s += hex[r & 15];
        }
        if (s.find_first_not_of('0') != std::string::npos) return s;  // all zero is invalid
    }
}

bool lower_hex(std::string_view s) {
    for (char c : s) {
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
}

json attr_json(const std::string & key, const AttrValue & v) {
    json value;
    if (const auto * s = std::get_if<std::string>(&v))
        value["stringValue"] = *s;
    else if (const auto * i = std::get_if<int64_t>(&v))
        value["intValue"] = std::to_string(*i);  // int64 travels as a string in proto3 JSON
    else if (const auto * d = std::get_if<double>(&v))
        value["doubleValue"] = *d;
    else
        value["boolValue"] = std::get<bool>(v);
    return json{{"key", key}, {"value", std::move(value)}};
}

json attrs_json(const std::vector<std::pair<std::string, AttrValue>> & attrs) {
    json a = json::array();
    for (const auto & [k, v] : attrs)
        a.push_back(attr_json(k, v));
    return a;
}

std::mutex g_mu;
std::shared_ptr<Tracer> g_tracer;

}  // namespace

std::string TraceContext::traceparent() const {
    if (!valid()) return {};
    return "00-" + trace_id + "-" + span_id + (sampled ? "-01" : "-00");
}

std::optional<TraceContext> TraceContext::in_record(std::string_view data) {
    // A session's record is written with nlohmann's compact dump: the key, then a string with no
    // escapes.
    constexpr std::string_view key = "\"traceparent\":\"";
    const size_t at = data.find(key);
    if (at == std::string_view::npos) return std::nullopt;
    const size_t from = at + key.size(), to = data.find('"', from);
    if (to == std::string_view::npos) return std::nullopt;
    return parse(data.substr(from, to - from));
}

std::optional<TraceContext> TraceContext::parse(std::string_view h) {
    while (!h.empty() && (h.front() == ' ' || h.front() == '\t'))
        h.remove_prefix(1);
    while (!h.empty() && (h.back() == ' ' || h.back() == '\t'))
        h.remove_suffix(1);
    // version(2) - trace(32) - span(16) - flags(2): 55 characters; later versions may add fields
    if (h.size() < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
    const std::string_view version = h.substr(0, 2), trace = h.substr(3, 32), span = h.substr(36, 16),
                           flags = h.substr(53, 2);
    if (!lower_hex(version) || version == "ff" || !lower_hex(trace) || !lower_hex(span) || !lower_hex(flags))
        return std::nullopt;
    if (version == "00" && h.size() != 55) return std::nullopt;
    if (version != "00" && h.size() > 55 && h[55] != '-') return std::nullopt;
    if (trace.find_first_not_of('0') == std::string_view::npos || span.find_first_not_of('0') == std::string_view::npos)
        return std::nullopt;
    TraceContext c;
    c.trace_id = std::string(trace);
    c.span_id = std::string(span);
    c.sampled = (std::stoi(std::string(flags), nullptr, 16) & 1) != 0;
    return c;
}

std::string new_trace_id() {
    return random_hex(32);
}
std::string new_span_id() {
    return random_hex(16);
}

int64_t unix_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

Span Span::start(std::string name, SpanKind kind, const std::optional<TraceContext> & parent) {
    Span s;
    s.name = std::move(name);
    s.kind = kind;
    s.start_ns = unix_now_ns();
    s.ctx.span_id = new_span_id();
    if (parent && parent->valid()) {
        s.ctx.trace_id = parent->trace_id;
        s.ctx.sampled = parent->sampled;
        s.parent_id = parent->span_id;
    } else {
        s.ctx.trace_id = new_trace_id();
    }
    return s;
}

void Span::set(std::string key, AttrValue v) {
    for (auto & [k, old] : attrs) {
        if (k == key) {
            old = std::move(v);
            return;
        }
    }
    attrs.emplace_back(std::move(key), std::move(v));
}

void Span::http_status(int status) {
    if (status <= 0) return;  // answered elsewhere, or not at all: nothing to say
    set("http.response.status_code", int64_t(status));
    if (status >= 500 || (status >= 400 && kind == SpanKind::client)) fail("HTTP " + std::to_string(status));
}

std::string otlp_json(const std::vector<Span> & spans, const std::string & service_name,
                      const std::vector<std::pair<std::string, AttrValue>> & resource) {
    json list = json::array();
    for (const Span & s : spans) {
        json j = {{"traceId", s.ctx.trace_id},
                  {"spanId", s.ctx.span_id},
                  {"name", s.name},
                  {"kind", int(s.kind)},
                  {"startTimeUnixNano", std::to_string(s.start_ns)},
                  {"endTimeUnixNano", std::to_string(s.end_ns)},
                  {"attributes", attrs_json(s.attrs)},
                  {"flags", s.ctx.sampled ? 1 : 0}};
        if (!s.parent_id.empty()) j["parentSpanId"] = s.parent_id;
        if (s.error) j["status"] = {{"code", 2}, {"message", s.status_message}};
        list.push_back(std::move(j));
    }
    auto res = resource;
    res.insert(res.begin(), {"service.name", service_name});
    json body = {{"resourceSpans",
                  json::array({{{"resource", {{"attributes", attrs_json(res)}}},
                                {"scopeSpans", json::array({{{"scope", {{"name", "armada"}}}, {"spans", list}}})}}})}};
    return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

Tracer::Tracer(Options o, OtlpPost post, Registry * metrics) : o_(std::move(o)), post_(std::move(post)) {
    if (metrics) metrics_binding_ = count_in(*metrics);
    if (post_) thread_ = std::thread([this] { run(); });
}

std::shared_ptr<void> Tracer::count_in(Registry & m) {
    auto & e = m.counter("armada_trace_spans_exported_total", "Spans the OTLP collector accepted");
    auto & d = m.counter("armada_trace_spans_dropped_total",
                         "Spans dropped: the queue was full or the collector refused or was away");
    std::lock_guard lk(mu_);  // the exporter counts under it too: nothing is counted twice or lost
    e.inc(exported_.load());
    d.inc(dropped_.load());
    exported_metric_ = &e;
    dropped_metric_ = &d;
    // The exporter and `end` count under `mu_`: once this runs, neither touches `m` again.
    return std::shared_ptr<void>(nullptr, [this, pe = &e, pd = &d](void *) {
        std::lock_guard lk2(mu_);
        if (exported_metric_.load() == pe) exported_metric_ = nullptr;
        if (dropped_metric_.load() == pd) dropped_metric_ = nullptr;
    });
}

Tracer::~Tracer() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void Tracer::end(Span s) {
    if (!post_ || !s.ctx.sampled) return;
    if (s.end_ns == 0) s.end_ns = unix_now_ns();
    std::lock_guard lk(mu_);
    if (queue_.size() >= o_.max_queue) {
        dropped_.fetch_add(1);
        if (auto * d = dropped_metric_.load()) d->inc();
        return;
    }
    queue_.push_back(std::move(s));
    if (queue_.size() >= o_.max_batch) cv_.notify_one();
}

void Tracer::flush(int max_ms) {
    if (!post_) return;
    std::unique_lock lk(mu_);
    flush_asked_ = true;
    cv_.notify_one();
    idle_cv_.wait_for(lk, std::chrono::milliseconds(max_ms), [&] { return (queue_.empty() && !sending_) || stop_; });
}

void Tracer::run() {
    std::unique_lock lk(mu_);
    while (!stop_) {
        cv_.wait_for(lk, std::chrono::milliseconds(o_.flush_ms),
                     [&] { return stop_ || flush_asked_ || queue_.size() >= o_.max_batch; });
        flush_asked_ = false;
        while (!queue_.empty()) {
            std::vector<Span> batch;
            while (!queue_.empty() && batch.size() < o_.max_batch) {
                batch.push_back(std::move(queue_.front()));
                queue_.pop_front();
            }
            sending_ = true;
            lk.unlock();
            const std::string err = post_(otlp_json(batch, o_.service_name, o_.resource));
            lk.lock();
            sending_ = false;
            // A batch the collector did not take is dropped, not retried: the queue stays bounded
            // and the request path never waits on a collector that is away.
            if (err.empty()) {
                exported_.fetch_add(batch.size());
                if (auto * e = exported_metric_.load()) e->inc(batch.size());
            } else {
                dropped_.fetch_add(batch.size());
                if (auto * d = dropped_metric_.load()) d->inc(batch.size());
            }
            if (stop_) break;
        }
        idle_cv_.notify_all();
    }
    idle_cv_.notify_all();
}

std::shared_ptr<Tracer> tracer() {
    std::lock_guard lk(g_mu);
    if (!g_tracer) g_tracer = std::make_shared<Tracer>(Tracer::Options{}, nullptr);
    return g_tracer;
}

void set_tracer(std::shared_ptr<Tracer> t) {
    std::lock_guard lk(g_mu);
    g_tracer = std::move(t);
}

}  // namespace armada::obs

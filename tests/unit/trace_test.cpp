#include "obs/trace.h"
#include "agent/session_manager.h"
#include "cli/tracing.h"
#include "obs/metrics.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <condition_variable>
#include <mutex>

namespace {

using armada::obs::Span;
using armada::obs::SpanKind;
using armada::obs::TraceContext;
using armada::obs::Tracer;
using json = nlohmann::json;

TEST(TraceContext, ReadsAndWritesTraceparent) {
    const auto c = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    ASSERT_TRUE(c);
    EXPECT_EQ(c->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    EXPECT_EQ(c->span_id, "00f067aa0ba902b7");
    EXPECT_TRUE(c->sampled);
    EXPECT_EQ(c->traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    const auto unsampled = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
    ASSERT_TRUE(unsampled);
    EXPECT_FALSE(unsampled->sampled);
    // A later version is read by its first four fields.
    EXPECT_TRUE(TraceContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"));
}

TEST(TraceContext, RefusesMalformedHeaders) {
    for (const char * bad : {
             "",
             "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",       // no flags
             "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // upper case
             "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace
             "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero span
             "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // forbidden version
             "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  // v00 has no more fields
             "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // separators
             "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",    // not hex
         }) {
        EXPECT_FALSE(TraceContext::parse(bad)) << bad;
    }
}

// A session's row keeps the trace it is in (its `data`, as `SessionManager::record` dumps it); a
// brain that moves the session reads it back with `record_trace`.
TEST(SessionRecordTrace, ReadsTheTraceARowKeeps) {
    using armada::agent::SessionManager;
    const Span turn = Span::start("invoke_agent a", SpanKind::internal, std::nullopt);
    const std::string tp = turn.context().traceparent();
    const json data = {{"model_steps", 3}, {"prompt_tokens", 120}, {"traceparent", tp}, {"dropped_tools", 0}};
    const auto got = SessionManager::record_trace(data.dump());
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->trace_id, turn.ctx.trace_id);
    EXPECT_EQ(got->span_id, turn.ctx.span_id);
    // A row from before traces were kept, or none at all.
    EXPECT_FALSE(SessionManager::record_trace(R"({"model_steps":3,"prompt_tokens":120})").has_value());
    EXPECT_FALSE(SessionManager::record_trace("").has_value());
    // Damaged: cut short, or not a trace context.
    EXPECT_FALSE(
        SessionManager::record_trace(R"({"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad)").has_value());
    EXPECT_FALSE(SessionManager::record_trace(R"({"traceparent":"nope"})").has_value());
    EXPECT_FALSE(SessionManager::record_trace(R"({"traceparent":")").has_value());
}

TEST(Span, AChildKeepsItsParentsTraceAndARootStartsANewOne) {
    const Span root = Span::start("invoke_agent", SpanKind::internal, std::nullopt);
    EXPECT_TRUE(root.ctx.valid());
    EXPECT_TRUE(root.parent_id.empty());
    const Span child = Span::start("chat", SpanKind::internal, root.context());
    EXPECT_EQ(child.ctx.trace_id, root.ctx.trace_id);
    EXPECT_EQ(child.parent_id, root.ctx.span_id);
    EXPECT_NE(child.ctx.span_id, root.ctx.span_id);
    const Span other = Span::start("chat", SpanKind::internal, std::nullopt);
    EXPECT_NE(other.ctx.trace_id, root.ctx.trace_id);
}

TEST(Otlp, SpansBecomeAnExportRequestInOtlpJson) {
    Span s = Span::start("execute_tool fetch", SpanKind::client, std::nullopt);
    s.set("gen_ai.tool.name", std::string("fetch"));
    s.set("gen_ai.usage.input_tokens", int64_t(12));
    s.set("armada.retry", true);
    s.set("armada.latency", 0.5);
    s.fail("timed out");
    s.end_ns = s.start_ns + 1000;
    const json j =
        json::parse(armada::obs::otlp_json({s}, "armada-node", {{"service.instance.id", std::string("n1")}}));
    const json & rs = j.at("resourceSpans").at(0);
    EXPECT_EQ(rs.at("resource").at("attributes").at(0).at("value").at("stringValue"), "armada-node");
    EXPECT_EQ(rs.at("resource").at("attributes").at(1).at("key"), "service.instance.id");
    const json & sp = rs.at("scopeSpans").at(0).at("spans").at(0);
    EXPECT_EQ(sp.at("traceId"), s.ctx.trace_id);
    EXPECT_EQ(sp.at("spanId"), s.ctx.span_id);
    EXPECT_FALSE(sp.contains("parentSpanId"));
    EXPECT_EQ(sp.at("kind"), 3);
    EXPECT_EQ(sp.at("endTimeUnixNano"), std::to_string(s.start_ns + 1000));
    EXPECT_EQ(sp.at("status").at("code"), 2);
    EXPECT_EQ(sp.at("status").at("message"), "timed out");
    const json & a = sp.at("attributes");
    EXPECT_EQ(a.at(0).at("value").at("stringValue"), "fetch");
    EXPECT_EQ(a.at(1).at("value").at("intValue"), "12");  // int64 as a string
    EXPECT_EQ(a.at(2).at("value").at("boolValue"), true);
    EXPECT_EQ(a.at(3).at("value").at("doubleValue"), 0.5);
}

TEST(Tracer, ExportsInBatchesAndCountsThem) {
    std::mutex mu;
    std::vector<json> bodies;
    armada::obs::Registry m;
    Tracer t(
        {.service_name = "t", .max_batch = 2, .flush_ms = 10000},
        [&](const std::string & body) {
            std::lock_guard lk(mu);
            bodies.push_back(json::parse(body));
            return std::string();
        },
        &m);
    for (int i = 0; i < 3; ++i)
        t.end(Span::start("s" + std::to_string(i), SpanKind::internal, std::nullopt));
    t.flush();
    EXPECT_EQ(t.exported(), 3u);
    size_t spans = 0;
    for (const auto & b : bodies)
        spans += b.at("resourceSpans").at(0).at("scopeSpans").at(0).at("spans").size();
    EXPECT_EQ(spans, 3u);
    EXPECT_GE(bodies.size(), 2u);  // batches hold at most 2
    EXPECT_NE(m.render().find("armada_trace_spans_exported_total 3"), std::string::npos);
}

TEST(Tracer, AFullQueueOrAnAbsentCollectorDropsAndCounts) {
    std::mutex mu;
    std::condition_variable cv;
    bool release = false, entered = false;
    Tracer t({.max_queue = 2, .max_batch = 1, .flush_ms = 10}, [&](const std::string &) {
        std::unique_lock lk(mu);
        entered = true;
        cv.notify_all();
        cv.wait(lk, [&] { return release; });
        return std::string("connection refused");
    });
    t.end(Span::start("first", SpanKind::internal, std::nullopt));
    {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return entered; });  // the exporter holds "first" and waits
    }
    for (int i = 0; i < 5; ++i)
        t.end(Span::start("more", SpanKind::internal, std::nullopt));
    EXPECT_EQ(t.dropped(), 3u);  // two fit in the queue
    {
        std::lock_guard lk(mu);
        release = true;
    }
    cv.notify_all();
    t.flush();
    EXPECT_EQ(t.dropped(), 6u);  // the collector refused all three batches it was sent
    EXPECT_EQ(t.exported(), 0u);
}

TEST(Tracer, ADisabledTracerKeepsNothing) {
    Tracer t({}, nullptr);
    EXPECT_FALSE(t.enabled());
    t.end(Span::start("x", SpanKind::internal, std::nullopt));
    t.flush();
    EXPECT_EQ(t.exported() + t.dropped(), 0u);
}

}  // namespace

TEST(OtlpUrl, TheFlagThenTheTracesVariableThenTheBaseVariable) {
    using armada::cli::otlp_traces_url;
    EXPECT_EQ(otlp_traces_url("http://c:4318", nullptr, nullptr), "http://c:4318/v1/traces");
    EXPECT_EQ(otlp_traces_url("http://c:4318/", nullptr, nullptr), "http://c:4318/v1/traces");
    EXPECT_EQ(otlp_traces_url("http://c:4318/custom/traces", nullptr, nullptr), "http://c:4318/custom/traces");
    EXPECT_EQ(otlp_traces_url("http://c:4318", "http://t/x", "http://b"), "http://c:4318/v1/traces");
    EXPECT_EQ(otlp_traces_url("", "http://t:4318/x", "http://b"), "http://t:4318/x");  // used as it is
    // The base variable always gets the signal's path, after its own.
    EXPECT_EQ(otlp_traces_url("", nullptr, "http://b:4318/otlp/"), "http://b:4318/otlp/v1/traces");
    EXPECT_EQ(otlp_traces_url("", "", "http://b:4318"), "http://b:4318/v1/traces");
    EXPECT_EQ(otlp_traces_url("", nullptr, nullptr), "");
}

TEST(Span, HttpStatusMarksServerErrorsAndClientRefusals) {
    auto server = Span::start("POST /v1/chat/completions", SpanKind::server, std::nullopt);
    server.http_status(404);  // the caller's mistake: the server did its job
    EXPECT_FALSE(server.error);
    server.http_status(503);
    EXPECT_TRUE(server.error);
    EXPECT_EQ(server.status_message, "HTTP 503");
    const auto code = std::find_if(server.attrs.begin(), server.attrs.end(),
                                   [](const auto & a) { return a.first == "http.response.status_code"; });
    ASSERT_NE(code, server.attrs.end());
    EXPECT_EQ(std::get<int64_t>(code->second), 503);

    auto client = Span::start("POST", SpanKind::client, std::nullopt);
    client.http_status(429);
    EXPECT_TRUE(client.error);
    auto ok = Span::start("GET", SpanKind::server, std::nullopt);
    ok.http_status(200);
    ok.http_status(0);  // not known: changes nothing
    EXPECT_FALSE(ok.error);
    EXPECT_EQ(ok.attrs.size(), 1u);
}

#include "obs/metrics.h"

#include <gtest/gtest.h>

using namespace armada::obs;

TEST(Metrics, CounterRendersWithLabels) {
    Registry r;
    r.counter("armada_requests_total", "reqs", {{"route", "/v1/chat/completions"}, {"code", "200"}}).inc(3);
    const auto text = r.render();
    EXPECT_NE(text.find("# TYPE armada_requests_total counter"), std::string::npos);
    EXPECT_NE(text.find("armada_requests_total{route=\"/v1/chat/completions\",code=\"200\"} 3"), std::string::npos);
}

TEST(Metrics, SameLabelsSameCounter) {
    Registry r;
    auto & a = r.counter("x_total", "x", {{"a", "1"}});
    auto & b = r.counter("x_total", "x", {{"a", "1"}});
    EXPECT_EQ(&a, &b);
}

TEST(Metrics, HistogramIsCumulative) {
    Registry r;
    auto & h = r.histogram("lat_seconds", "l", {0.1, 1.0});
    h.observe(0.05);
    h.observe(0.5);
    h.observe(5);
    const auto text = r.render();
    EXPECT_NE(text.find("lat_seconds_bucket{le=\"0.1\"} 1"), std::string::npos);
    EXPECT_NE(text.find("lat_seconds_bucket{le=\"1\"} 2"), std::string::npos);
    EXPECT_NE(text.find("lat_seconds_bucket{le=\"+Inf\"} 3"), std::string::npos);
    EXPECT_NE(text.find("lat_seconds_count 3"), std::string::npos);
}

TEST(Metrics, LabelValuesEscaped) {
    EXPECT_EQ(format_labels({{"a", "x\"y\\z\n"}}), "{a=\"x\\\"y\\\\z\\n\"}");
}

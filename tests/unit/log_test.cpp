#include "obs/log.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using armada::obs::LogScope;
using armada::obs::TraceContext;

TEST(JsonLogs, ALineCarriesTheInnermostScopesSessionAndTrace) {
    using json = nlohmann::json;
    EXPECT_EQ(armada::obs::current_log_scope(), nullptr);
    const json bare = json::parse(armada::obs::json_log_line(1700000000123, "info", "hello \"x\"\n", nullptr));
    EXPECT_EQ(bare["ts"], "2023-11-14T22:13:20.123Z");
    EXPECT_EQ(bare["level"], "info");
    EXPECT_EQ(bare["msg"], "hello \"x\"\n");
    EXPECT_FALSE(bare.contains("session_id"));
    {
        const auto tc = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        const LogScope outer("sess_a", tc);
        {
            const LogScope inner("sess_b", std::nullopt);
            const json j = json::parse(armada::obs::json_log_line(0, "warning", "m", armada::obs::current_log_scope()));
            EXPECT_EQ(j["session_id"], "sess_b");
            EXPECT_FALSE(j.contains("trace_id"));
        }
        const json j = json::parse(armada::obs::json_log_line(0, "info", "m", armada::obs::current_log_scope()));
        EXPECT_EQ(j["session_id"], "sess_a");
        EXPECT_EQ(j["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        EXPECT_EQ(j["span_id"], "00f067aa0ba902b7");
    }
    EXPECT_EQ(armada::obs::current_log_scope(), nullptr);
}

#include "obs/log.h"

#include "common/clock.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace armada::obs {
namespace {

thread_local const LogScope * t_scope = nullptr;

std::string iso_time(int64_t unix_ms) {
    const std::time_t secs = std::time_t(unix_ms / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[40];
    const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    char ms[8];
    std::snprintf(ms, sizeof ms, ".%03dZ", int(unix_ms % 1000));
    return std::string(buf, n) + ms;
}

class JsonFormatter : public spdlog::formatter {
  public:
    void format(const spdlog::details::log_msg & m, spdlog::memory_buf_t & dest) override {
        const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(m.time.time_since_epoch()).count();
        const auto lv = spdlog::level::to_string_view(m.level);
        const std::string line = json_log_line(ms, std::string(lv.data(), lv.size()),
                                               std::string(m.payload.data(), m.payload.size()), t_scope) +
                                 "\n";
        dest.append(line.data(), line.data() + line.size());
    }
    std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

LogScope::LogScope(std::string session, const std::optional<TraceContext> & trace)
    : session_id(std::move(session)), prev_(t_scope) {
    if (trace && trace->valid()) {
        trace_id = trace->trace_id;
        span_id = trace->span_id;
    }
    t_scope = this;
}

LogScope::~LogScope() {
    t_scope = prev_;
}

const LogScope * current_log_scope() {
    return t_scope;
}

std::string json_log_line(int64_t unix_ms, const std::string & level, const std::string & msg, const LogScope * scope) {
    nlohmann::ordered_json j = {{"ts", iso_time(unix_ms)}, {"level", level}, {"msg", msg}};
    if (scope) {
        if (!scope->session_id.empty()) j["session_id"] = scope->session_id;
        if (!scope->trace_id.empty()) {
            j["trace_id"] = scope->trace_id;
            j["span_id"] = scope->span_id;
        }
    }
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {
std::atomic<bool> g_json_logs{false};
}

void use_json_logs() {
    g_json_logs = true;
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
}

bool json_logs() {
    return g_json_logs.load();
}

void announce(const std::string & line) {
    std::string out = line;
    if (g_json_logs.load()) {
        out = json_log_line(common::wall_ms(), "info", line, nullptr);
    }
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
}

}  // namespace armada::obs

#pragma once

// Structured logs: with `use_json_logs`, every spdlog line is one JSON object (time, level,
// message) that also carries the session and trace the thread is working on, when a `LogScope`
// names them. A log search then joins lines to traces (trace_id) and to sessions (session_id).

#include "obs/trace.h"

#include <optional>
#include <string>

namespace armada::obs {

//! What the calling thread works on, for the log lines it writes until the scope ends. Scopes
//! nest; the innermost wins.
class LogScope {
  public:
    LogScope(std::string session_id, const std::optional<TraceContext> & trace);
    ~LogScope();
    LogScope(const LogScope &) = delete;
    LogScope & operator=(const LogScope &) = delete;

    std::string session_id;
    std::string trace_id, span_id;

  private:
    const LogScope * prev_;
};

//! The innermost scope of this thread, or null.
const LogScope * current_log_scope();

//! One log line as JSON: {"ts","level","msg"} plus the scope's ids (tests and the formatter).
std::string json_log_line(int64_t unix_ms, const std::string & level, const std::string & msg, const LogScope * scope);

//! Switches the process's logger to JSON lines (same sink, one object per line).
void use_json_logs();

//! A line for the person or script that started the process ("listening on …", "leads …"), on
//! stdout and flushed at once; with JSON logs, as a JSON line like the log's own.
void announce(const std::string & line);
//! Whether `use_json_logs` was called.
bool json_logs();

}  // namespace armada::obs

#pragma once

#include <string>

namespace armada::cli {

//! Where spans go, as OpenTelemetry's exporters decide it: the flag (a URL; /v1/traces is added
//! when it names no path), else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as it is), else
//! OTEL_EXPORTER_OTLP_ENDPOINT (a base URL: /v1/traces is always added). "" when none is set.
std::string otlp_traces_url(const std::string & flag, const char * traces_env, const char * base_env);

//! Installs the process's tracer: spans of this process (`service`, e.g. "armada-node") go to
//! the OTLP/HTTP collector at `url` (see `otlp_traces_url`). Empty `url`: tracing stays off
//! (trace context still flows). Returns an error message for a URL it cannot use.
std::string start_tracing(const std::string & url, const std::string & service);

}  // namespace armada::cli

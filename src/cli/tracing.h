#pragma once

#include <string>

namespace armada::cli {

//! Installs the process's tracer: spans of this process (`service`, e.g. "armada-node") go to
//! the OTLP/HTTP collector at `endpoint` (a base URL such as http://collector:4318, to which
//! /v1/traces is added unless the URL already names a path). Empty `endpoint`: tracing stays off
//! (trace context still flows). Returns an error message for an endpoint it cannot use.
std::string start_tracing(const std::string & endpoint, const std::string & service);

}  // namespace armada::cli

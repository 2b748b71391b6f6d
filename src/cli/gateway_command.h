#pragma once

// `armada gateway`: the process around a `gateway::Gateway` (its flags are `GatewayOptions`).

#include "gateway/gateway.h"

namespace armada::cli {

//! Runs a gateway until SIGINT/SIGTERM (SIGHUP reloads its pools); returns the exit code.
int gateway_command(const gateway::GatewayOptions & o);

}  // namespace armada::cli

#pragma once

#include "obs/metrics.h"

#include <csignal>
#include <functional>
#include <memory>
#include <string>

namespace armada::cli {

//! Serves a brain's /metrics and /livez, with no key, for Prometheus, on `host`:`port` (0: any
//! free port), and prints where. The listener runs while the result lives; null with `error`.
std::shared_ptr<void> serve_brain_metrics(obs::Registry & metrics, const std::string & host, int port,
                                          std::string & error);

//! Waits up to `ms` for one of `stop_set`'s signals (blocked in every thread); true when one came.
std::function<bool(int)> signal_waiter(sigset_t stop_set);

}  // namespace armada::cli

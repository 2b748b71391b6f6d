#pragma once

#include "api/http_server.h"
#include "engine/engine.h"

#include <string>

namespace armada::cli {

//! Everything `armada serve` takes from flags and ARMADA_* variables.
struct ServeOptions {
    std::string model;
    engine::EngineConfig engine;
    api::HttpConfig http;
    std::string api_key;
    std::string api_key_file;
    std::string log_level = "info";
};

//! Runs the node until SIGINT/SIGTERM. Returns the process exit code.
int serve(const ServeOptions & opt);

}  // namespace armada::cli

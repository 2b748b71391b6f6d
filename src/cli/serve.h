#pragma once

#include "api/http_server.h"
#include "engine/engine.h"

#include <string>
#include <vector>

namespace armada::cli {

//! Everything `armada serve` takes from flags and ARMADA_* variables.
struct ServeOptions {
    std::string model;
    engine::EngineConfig engine;
    api::HttpConfig http;
    std::string api_key;
    std::string api_key_file;
    std::string log_level = "info";
    std::string agents_file;
    std::string data_dir = "./armada-data";
    std::vector<std::string> tool_allow;  // CIDRs tools may reach despite the SSRF guard
    std::string kv_budget;                // size text, e.g. "8G"; empty: automatic
    std::string kv_disk = "64G";
    bool no_park = false;
    bool no_kv_journal = false;
    double rate_rpm = 0;  // per API key; 0: unlimited
    double rate_tpm = 0;
};

//! Runs the node until SIGINT/SIGTERM. Returns the process exit code.
int serve(const ServeOptions & opt);

}  // namespace armada::cli

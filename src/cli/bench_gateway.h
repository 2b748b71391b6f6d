#pragma once

#include <string>

namespace armada::cli {

struct BenchGatewayOptions {
    std::string gateway;  // http://host:port
    std::string node;     // a node behind it
    std::string route = "/v1/models";
    std::string body;  // POST body; empty: GET
    std::string api_key;
    int requests = 2000;  // per side
    int warmup = 100;
};

//! `armada bench gateway`: the latency a gateway adds. The same small request goes to the node
//! directly and through the gateway, alternately, one at a time, so both sides see the same
//! machine; prints the percentiles of each and of the difference. Returns the exit code.
int bench_gateway(const BenchGatewayOptions & o);

}  // namespace armada::cli

#include "cli/bench_gateway.h"

#include "bench/http_client.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

namespace armada::cli {

namespace {
double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t i = std::min(v.size() - 1, size_t(std::lround(p * double(v.size() - 1))));
    return v[i];
}
}  // namespace

int bench_gateway(const BenchGatewayOptions & o) {
    std::vector<std::pair<std::string, std::string>> headers;
    if (!o.api_key.empty()) headers.emplace_back("Authorization", "Bearer " + o.api_key);
    if (!o.body.empty()) headers.emplace_back("Content-Type", "application/json");
    const std::string method = o.body.empty() ? "GET" : "POST";
    std::vector<double> direct, via;
    auto once = [&](const std::string & base, std::vector<double> * out) {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = bench::http_call(method, base + o.route, o.body, headers, 30000);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (r.status != 200) {
            fprintf(stderr, "error: %s%s answered %d %s\n", base.c_str(), o.route.c_str(), r.status,
                    r.error.empty() ? r.body.substr(0, 200).c_str() : r.error.c_str());
            return false;
        }
        if (out) out->push_back(ms);
        return true;
    };
    for (int i = 0; i < o.warmup; ++i) {
        if (!once(o.node, nullptr) || !once(o.gateway, nullptr)) return 1;
    }
    for (int i = 0; i < o.requests; ++i) {
        // Alternate which goes first, so neither side always meets a warmer machine.
        const bool node_first = i % 2 == 0;
        if (!once(node_first ? o.node : o.gateway, node_first ? &direct : &via)) return 1;
        if (!once(node_first ? o.gateway : o.node, node_first ? &via : &direct)) return 1;
    }
    std::vector<double> diff;
    for (size_t i = 0; i < direct.size(); ++i)
        diff.push_back(via[i] - direct[i]);
    printf("%s %s, %d requests each, one at a time, a new connection per request\n", method.c_str(), o.route.c_str(),
           o.requests);
    printf("| path | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|\n");
    printf("| node directly | %.3f | %.3f | %.3f |\n", pct(direct, 0.5), pct(direct, 0.9), pct(direct, 0.99));
    printf("| through the gateway | %.3f | %.3f | %.3f |\n", pct(via, 0.5), pct(via, 0.9), pct(via, 0.99));
    printf("| added by the gateway (p of paired differences) | %.3f | %.3f | %.3f |\n", pct(diff, 0.5), pct(diff, 0.9),
           pct(diff, 0.99));
    printf("added p99 (gateway p99 - node p99): %.3f ms\n", pct(via, 0.99) - pct(direct, 0.99));
    return 0;
}

}  // namespace armada::cli

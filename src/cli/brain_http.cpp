#include "cli/brain_http.h"

#include "api/http_server.h"
#include "obs/log.h"

#include <fmt/format.h>

#include <ctime>

namespace armada::cli {

std::shared_ptr<void> serve_brain_metrics(obs::Registry & metrics, const std::string & host, int port,
                                          std::string & error) {
    api::HttpConfig mc;
    mc.host = host;
    mc.port = uint16_t(port);
    mc.threads = 1;
    mc.max_body = 4096;
    mc.max_connections = 64;
    auto http = std::make_shared<api::HttpServer>(mc, [&metrics](api::HttpRequest && r,
                                                                 std::shared_ptr<api::Responder> out) {
        if (r.method != "GET")
            out->send(405, "application/json", R"({"error":{"message":"GET only","type":"invalid_request_error"}})");
        else if (r.path == "/metrics")
            out->send(200, "text/plain; version=0.0.4", metrics.render());
        else if (r.path == "/livez" || r.path == "/health")
            out->send(200, "application/json", R"({"status":"ok"})");
        else
            out->send(404, "application/json", R"({"error":{"message":"not found","type":"invalid_request_error"}})");
    });
    if (auto e = http->listen(); !e.empty()) {
        error = e;
        return nullptr;
    }
    http->run();
    obs::announce(fmt::format("armada: metrics on http://{}:{}/metrics", host, http->port()));
    return std::shared_ptr<void>(http.get(), [http](void *) { http->stop(); });
}

std::function<bool(int)> signal_waiter(sigset_t stop_set) {
    return [stop_set](int ms) {
        timespec t{ms / 1000, long(ms % 1000) * 1000000L};
        return sigtimedwait(&stop_set, nullptr, &t) > 0;
    };
}

}  // namespace armada::cli

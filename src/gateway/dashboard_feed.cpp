#include "gateway/dashboard_feed.h"

#include "common/clock.h"
#include "gateway/dashboard.h"
#include "gateway/replies.h"
#include "net/sse.h"

#include <spdlog/spdlog.h>

#include <chrono>

namespace armada::gateway {

namespace {

using json = nlohmann::json;

api::Headers page_headers() {
    return {{"Cache-Control", "no-store"},
            {"X-Content-Type-Options", "nosniff"},
            {"Referrer-Policy", "no-referrer"},
            {"X-Frame-Options", "DENY"},
            {"Content-Security-Policy",
             "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
             "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"}};
}

//! Names come from etcd's keys: bytes that are not UTF-8 are replaced, never thrown on.
std::string dump(const json & j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

void DashboardFeed::start(const std::string & gateway) {
    {
        std::lock_guard lk(mu_);
        gateway_ = gateway;
    }
    thread_ = std::thread([this] { feed(); });
}

void DashboardFeed::stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
}

void DashboardFeed::route(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                          const api::Caller & caller) {
    if (!caller.admin) return send_error(out, 403, "the dashboard needs an admin key", 0, "permission_denied");
    const std::string & p = req.path;
    if (req.method != "GET") return send_error(out, 405, "the dashboard takes GET only");
    if (p == "/dashboard" || p == "/dashboard/")
        return out->send(200, "text/html; charset=utf-8", std::string(dashboard_html()), page_headers());
    if (p == "/dashboard/app.js")
        return out->send(200, "text/javascript; charset=utf-8", std::string(dashboard_js()), page_headers());
    if (p == "/dashboard/snapshot") return out->send(200, "application/json", dump(snapshot()), page_headers());
    if (p == "/dashboard/events") {
        const std::string first = sse_snapshot();
        std::lock_guard lk(mu_);
        if (open_.size() >= kMax)
            return send_error(out, 503,
                              "this gateway already feeds " + std::to_string(kMax) +
                                  " dashboards; close one or open another gateway's",
                              5, "overloaded");
        out->start_stream(200, {{"Cache-Control", "no-store"}, {"X-Accel-Buffering", "no"}});
        out->long_lived();
        out->write("retry: 2000\n\n" + first);
        open_.push_back(out);
        return;
    }
    send_error(out, 404,
               "no dashboard route " + p +
                   "; there are /dashboard (the page), /dashboard/events (its SSE stream) and /dashboard/snapshot "
                   "(one snapshot as JSON)",
               0, "not_found");
}

json DashboardFeed::snapshot() {
    DashboardView v;
    v.at_ms = common::wall_ms();
    {
        std::lock_guard lk(mu_);
        v.gateway = gateway_;
    }
    view_.fill(v);
    return dashboard_snapshot(v);
}

std::string DashboardFeed::sse_snapshot() {
    return net::sse_event("snapshot", dump(snapshot()));
}

void DashboardFeed::feed() {
    // Each second, one snapshot to every open dashboard (made once for all of them); the ones
    // whose browser went away are dropped.
    while (!stop_.load()) {
        for (int i = 0; i < 20 && !stop_.load(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        {
            std::lock_guard lk(mu_);
            std::erase_if(open_, [](const auto & o) { return o->closed(); });
            if (open_.empty()) continue;
        }
        try {
            const std::string event = sse_snapshot();
            std::lock_guard lk(mu_);
            for (const auto & o : open_)
                o->write(event);
        } catch (const std::exception & e) {
            spdlog::error("gateway: dashboard snapshot: {}", e.what());
        }
    }
}

}  // namespace armada::gateway

#pragma once

// The dashboard's routes on a gateway (/dashboard, its script, one snapshot, and its SSE stream)
// and the feed that sends every open dashboard a snapshot of the cluster view each second.
//
// Owns: the open dashboards and their feed thread. It reads the cluster view; it may not relay
// or touch the store.

#include "api/auth.h"
#include "api/http_server.h"
#include "gateway/cluster_view.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace armada::gateway {

class DashboardFeed {
  public:
    //! At most this many open dashboards per gateway.
    static constexpr size_t kMax = 64;

    explicit DashboardFeed(ClusterView & view) : view_(view) {}
    ~DashboardFeed() { stop(); }
    DashboardFeed(const DashboardFeed &) = delete;
    DashboardFeed & operator=(const DashboardFeed &) = delete;

    //! Starts the feed; `gateway` names this gateway in the snapshots.
    void start(const std::string & gateway);
    void stop();
    //! A request under /dashboard (admin keys only).
    void route(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out, const api::Caller & caller);
    //! The cluster as this gateway sees it now (see dashboard_snapshot).
    nlohmann::json snapshot();

  private:
    std::string sse_snapshot();
    void feed();

    ClusterView & view_;
    std::mutex mu_;
    std::string gateway_;                                // mu_
    std::vector<std::shared_ptr<api::Responder>> open_;  // open event streams; mu_
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace armada::gateway

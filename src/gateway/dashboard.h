#pragma once

// The gateway's live dashboard: a snapshot of the cluster as etcd shows it (the nodes' load reports
// and the leading cell brains' aggregates), sent over SSE to a page that ships in the binary.

#include "cluster/global_brain.h"
#include "gateway/routing.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace armada::gateway {

struct DashboardView {
    int64_t at_ms = 0;  // wall clock, ms since the epoch
    std::string gateway;
    int gateways = 1;     // live gateways in etcd
    bool etcd_ok = true;  // false: etcd cannot be read, and this is the last view it gave
    NodeViews nodes;
    std::map<std::string, cluster::CellReport> reports;  // by cell: the leading brains' aggregates
    cluster::Shares shares;
    //! The rollout's state as the leading global brain last wrote it (none: never started).
    std::optional<cluster::RolloutState> rollout;
};

//! One event of the dashboard's stream. Cell figures are the leading brain's report (what its
//! /metrics shows) when there is one, else summed from the cell's node reports (`reported`
//! false); nodes, sessions by state and the KV watermarks are the nodes' own reports; chain
//! survival and failovers come from the brains' reports.
nlohmann::json dashboard_snapshot(const DashboardView & v);

//! The page and its script, as shipped.
std::string_view dashboard_html();
std::string_view dashboard_js();

}  // namespace armada::gateway

// The dashboard's snapshot: cell figures from the brains' reports (as their /metrics), nodes and
// sessions by state from the nodes' reports, survival and failovers carried in the reports.
#include "gateway/dashboard.h"
#include "cluster/membership.h"

#include <gtest/gtest.h>

using namespace armada;
using namespace armada::gateway;
using cluster::CellReport;
using cluster::NodeLoad;

namespace {

NodeLoad load(const std::string & name, int sessions, int free_seqs, int64_t headroom, int64_t budget) {
    NodeLoad l;
    l.node = name;
    l.sessions = sessions;
    l.free_seqs = free_seqs;
    l.kv_headroom = headroom;
    l.kv_budget = budget;
    l.engines = 2;
    l.by_state = {{"running", sessions - 1}, {"waiting_input", 1}};
    l.url = "http://" + name;
    return l;
}

}  // namespace

TEST(CellReport, CarriesSurvivalAndFailoversThroughEtcd) {
    CellReport r;
    r.cell = "c1";
    r.ended = {{"completed", 9}, {"failed", 1}, {"lost", 2}, {"cancelled", 3}};
    r.failovers = {{1700000000000, "n1", 4}, {1700000005000, "n2", 1}};
    const auto back = cluster::decode_cell_report("c1", cluster::encode_cell_report(r));
    ASSERT_TRUE(back);
    EXPECT_EQ(back->ended, r.ended);
    EXPECT_EQ(back->failovers, r.failovers);
    // A report from before these fields: none of either.
    const auto old = cluster::decode_cell_report("c1", R"({"nodes":1,"capacity":4})");
    ASSERT_TRUE(old);
    EXPECT_TRUE(old->ended.empty());
    EXPECT_TRUE(old->failovers.empty());
    // A wrong type is a bad report, not a crash.
    EXPECT_FALSE(cluster::decode_cell_report("c1", R"({"failovers":[{"at_ms":"soon"}]})"));
    EXPECT_FALSE(cluster::decode_cell_report("c1", R"({"ended":{"completed":-1}})"));
    EXPECT_FALSE(cluster::decode_cell_report("c1", R"({"failovers":[{"node":"n","sessions":-2}]})"));
}

TEST(Dashboard, CellFiguresComeFromTheBrainsReportAndNodesFromTheirOwn) {
    DashboardView v;
    v.at_ms = 42;
    v.gateway = "gw1";
    v.gateways = 2;
    v.nodes["a1"] = {"a", load("a1", 3, 5, 250, 1000)};
    v.nodes["a2"] = {"a", load("a2", 2, 6, 1000, 1000)};
    v.nodes["b1"] = {"b", load("b1", 4, 1, 0, 0)};  // no KV budget reported
    CellReport ra = cluster::cell_report("a", {v.nodes["a1"].load, v.nodes["a2"].load}, {}, 7);
    ra.ended = {{"completed", 8}, {"failed", 1}, {"timed_out", 0}, {"lost", 1}, {"cancelled", 5}};
    ra.failovers = {{1000, "a3", 2}};
    v.reports["a"] = ra;
    v.shares.weight = {{"a", 0.75}, {"b", 0.25}};
    v.shares.full = {"b"};
    const auto s = dashboard_snapshot(v);

    EXPECT_EQ(s["gateway"], "gw1");
    EXPECT_EQ(s["gateways"], 2);
    ASSERT_EQ(s["cells"].size(), 2u);
    const auto & a = s["cells"][0];
    EXPECT_EQ(a["name"], "a");
    EXPECT_TRUE(a["reported"].get<bool>());
    EXPECT_EQ(a["live_sessions"], 5);
    EXPECT_EQ(a["free_seqs"], 11);
    EXPECT_EQ(a["queued"], 7);  // only the brain knows its queue
    EXPECT_DOUBLE_EQ(a["kv_watermark"].get<double>(), 750.0 / 2000.0);
    EXPECT_DOUBLE_EQ(a["weight"].get<double>(), 0.75);
    EXPECT_FALSE(a["full"].get<bool>());
    EXPECT_DOUBLE_EQ(a["survival"]["ratio"].get<double>(), 0.8);  // 8 of 10; the cancels are apart
    EXPECT_EQ(a["survival"]["cancelled"], 5);
    ASSERT_EQ(a["node_list"].size(), 2u);
    EXPECT_EQ(a["node_list"][0]["name"], "a1");
    EXPECT_DOUBLE_EQ(a["node_list"][0]["kv_watermark"].get<double>(), 0.75);
    EXPECT_EQ(a["node_list"][0]["engines"], 2);

    // A cell with no brain report: summed from its nodes, no survival known.
    const auto & b = s["cells"][1];
    EXPECT_FALSE(b["reported"].get<bool>());
    EXPECT_EQ(b["live_sessions"], 4);
    EXPECT_TRUE(b["survival"].is_null());
    EXPECT_TRUE(b["kv_watermark"].is_null());
    EXPECT_TRUE(b["full"].get<bool>());

    const auto & t = s["totals"];
    EXPECT_EQ(t["cells"], 2);
    EXPECT_EQ(t["nodes"], 3);
    EXPECT_EQ(t["live_sessions"], 9);
    EXPECT_EQ(t["by_state"]["running"], 2 + 1 + 3);
    EXPECT_EQ(t["by_state"]["waiting_input"], 3);
    EXPECT_DOUBLE_EQ(t["survival"]["ratio"].get<double>(), 0.8);

    ASSERT_EQ(s["failovers"].size(), 1u);
    EXPECT_EQ(s["failovers"][0]["cell"], "a");
    EXPECT_EQ(s["failovers"][0]["node"], "a3");
    EXPECT_EQ(s["failovers"][0]["sessions"], 2);
    EXPECT_TRUE(s["rollout"].is_null());
}

TEST(Dashboard, TheRolloutPanelShowsProgressTheWaveAndTheGateThatFired) {
    DashboardView v;
    v.nodes["a1"] = {"a", load("a1", 1, 1, 1, 1)};
    v.nodes["a2"] = {"a", load("a2", 1, 1, 1, 1)};
    v.nodes["b1"] = {"b", load("b1", 1, 1, 1, 1)};
    v.nodes["a1"].load.version = "v2";
    v.nodes["a2"].load.version = "v1";
    v.nodes["b1"].load.version = "v2";
    cluster::RolloutState st;
    st.id = "r-7";
    st.version = "v2";
    st.phase = "rolling_back";
    st.wave = 2;
    st.waves = 2;
    st.wave_nodes["b1"] = {"b", "v1", "v1", "rolling_back", 12, 0};
    st.wave_order = {"b1"};
    cluster::GateReading g;
    g.signal = "error_codes";
    g.code = "model";
    g.upgraded = 0.5;
    g.limit = 0.02;
    g.judged = g.fired = true;
    st.gates = {g};
    st.fired = "error_codes (model) fired: 0.5 on the wave vs 0 on the rest, 0 before (limit 0.02)";
    v.rollout = st;
    const auto r = dashboard_snapshot(v)["rollout"];
    EXPECT_EQ(r["id"], "r-7");
    EXPECT_EQ(r["phase"], "rolling_back");
    EXPECT_EQ(r["wave"], 2);
    EXPECT_EQ(r["upgraded"], 2);  // the nodes reporting v2
    EXPECT_EQ(r["total"], 3);
    ASSERT_EQ(r["nodes"].size(), 1u);
    EXPECT_EQ(r["nodes"][0]["name"], "b1");
    EXPECT_EQ(r["nodes"][0]["phase"], "rolling_back");
    ASSERT_EQ(r["gates"].size(), 1u);
    EXPECT_TRUE(r["gates"][0]["fired"].get<bool>());
    EXPECT_DOUBLE_EQ(r["gates"][0]["wave"].get<double>(), 0.5);
    EXPECT_EQ(r["fired"], st.fired);
    // The page draws it with its own script: the panel is no longer the raw JSON.
    EXPECT_NE(dashboard_js().find("data-rollout-node"), std::string_view::npos);
}

TEST(Dashboard, FailoversAreTheLatestFirstAndAtMostAPage) {
    DashboardView v;
    for (int c = 0; c < 3; ++c) {
        CellReport r;
        r.cell = "c" + std::to_string(c);
        for (int i = 0; i < 15; ++i)
            r.failovers.push_back({int64_t(i * 10 + c), "n" + std::to_string(i), 1});
        v.reports[r.cell] = r;
    }
    const auto s = dashboard_snapshot(v);
    ASSERT_EQ(s["failovers"].size(), CellReport::kMaxFailovers);
    EXPECT_EQ(s["failovers"][0]["at_ms"], 142);  // n14 of c2
    for (size_t i = 1; i < s["failovers"].size(); ++i)
        EXPECT_GT(s["failovers"][i - 1]["at_ms"].get<int64_t>(), s["failovers"][i]["at_ms"].get<int64_t>());
    EXPECT_TRUE(s["totals"]["survival"].is_null());  // no brain has read its ended sessions yet
}

TEST(Dashboard, PageAndScriptShipInTheBinary) {
    EXPECT_NE(dashboard_html().find("<script src=\"/dashboard/app.js\"></script>"), std::string_view::npos);
    EXPECT_NE(dashboard_js().find("new EventSource('/dashboard/events')"), std::string_view::npos);
    // Nothing is fetched from elsewhere.
    EXPECT_EQ(dashboard_html().find("http://"), std::string_view::npos);
    EXPECT_EQ(dashboard_html().find("https://"), std::string_view::npos);
}

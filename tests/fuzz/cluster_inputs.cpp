// What the cluster reads from elsewhere: its YAML config, a node's load report (JSON from etcd),
// a line of etcd's watch stream, etcd's base64, a simulator scenario, and a rollout's keys (spec,
// state, command, restart requests and acknowledgements). Any bytes must give a value
// or a reason, never a crash.
#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/membership.h"
#include "cluster/restarter.h"
#include "cluster/rollout.h"
#include "gateway/dashboard.h"
#include "sim/scenario.h"

#include <cstdlib>
#include <string>

using namespace armada::cluster;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string in(reinterpret_cast<const char *>(data), size);
    std::string error;
    if (!parse_cluster_config(in, error) && error.empty()) std::abort();  // a refusal says why
    if (!armada::sim::parse_scenario(in, error) && error.empty()) std::abort();
    // The one-pass reader takes only what the JSON parser reads the same way.
    if (auto fast = decode_load_canonical("n", in)) {
        auto slow = decode_load_json("n", in);
        if (!slow || !(*slow == *fast) || encode_load(*slow) != encode_load(*fast)) std::abort();  // -0.0 too
    }
    if (auto l = decode_load("n", in)) {
        auto back = decode_load("n", encode_load(*l));
        if (back->free_seqs != l->free_seqs || back->kv_by_tenant != l->kv_by_tenant) std::abort();
    }
    if (auto r = decode_cell_report("c", in)) {
        auto back = decode_cell_report("c", encode_cell_report(*r));
        if (back->capacity != r->capacity || back->ended != r->ended || back->failovers != r->failovers) std::abort();
        armada::gateway::DashboardView v;
        v.reports["c"] = *r;
        armada::gateway::dashboard_snapshot(v).dump();  // what the dashboard sends: never throws
    }
    if (auto s = decode_shares(in)) {
        if (decode_shares(encode_shares(*s))->weight != s->weight) std::abort();
        pick_cell(*s, in);
    }
    if (auto s = decode_rollout_spec(in)) {
        if (decode_rollout_spec(encode_rollout_spec(*s)) != s) std::abort();
    }
    if (auto c = decode_rollout_command(in)) {
        if (decode_rollout_command(encode_rollout_command(*c))->seq != c->seq) std::abort();
    }
    if (auto st = decode_rollout_state(in)) {
        // A new leader resumes from any state it can read, and decides without a crash.
        RolloutSpec spec;
        spec.id = st->id;
        spec.version = st->version.empty() ? "v" : st->version;
        Rollout r(spec, st, 1000);
        r.fleet({{"n", "c", "v0", false, {}}}, 2000);
        r.decide(2000);
        encode_rollout_state(r.state());
    }
    if (auto sig = decode_signals(in)) {
        if (decode_signals(encode_signals(*sig)) != sig) std::abort();
    }
    decode_restart_request("n", in);
    decode_restart_ack(in);
    std::vector<EtcdEvent> events;
    int64_t revision = 0;
    if (!EtcdClient::parse_watch_message(in, events, revision, error) && error.empty()) std::abort();
    EtcdClient::unbase64(in);
    if (EtcdClient::unbase64(EtcdClient::base64(in)) != in) std::abort();
    const std::string end = EtcdClient::prefix_end(in);
    if (!in.empty() && !(end > in) && end != std::string(1, '\0')) std::abort();
    return 0;
}

#pragma once

// How a rollout's restarts reach the nodes. The global brain asks; a restarter carries it out:
// `armada cluster up` (which owns its processes) through request and acknowledgement keys in
// etcd, the address both already share. A request outlives a global-brain failover, and the
// standby sees its acknowledgement.

#include "cluster/cluster_config.h"
#include "cluster/etcd.h"
#include "cluster/rollout.h"
#include "cluster/runtime/keys.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace armada::cluster {

//! `<prefix>/rollout/`: spec (the operator's), command (pause/resume/abort), state (the leading
//! global brain's), restart/<node> (requests), restarted/<node> (what was done).
inline std::string rollout_prefix(const ClusterConfig & c) {
    return ClusterKeys(c.prefix).rollout();
}

//! What a claim or an acknowledgement says when its brain no longer leads.
inline constexpr const char * kNotLeader = "this brain no longer leads";

//! What a restarter did about a node's latest request.
struct RestartAck {
    int64_t gen = 0;
    std::string version;
    int64_t pid = 0;
    int64_t at_ms = 0;
    std::string error;  // empty: restarted (the node is starting on `version`)
    std::string note;   // what else the restart did, for `status`
    int others = 0;     // other nodes that restart with it, one after another (a StatefulSet's way back)
};

std::string encode_restart_request(const RestartRequest & r, const std::string & rollout_id);
std::optional<RestartRequest> decode_restart_request(const std::string & node, const std::string & text);
std::string encode_restart_ack(const RestartAck & a);
std::optional<RestartAck> decode_restart_ack(const std::string & text);

class NodeRestarter {
  public:
    virtual ~NodeRestarter() = default;
    //! Asks for `r`: drain the node, stop it, start it on `r.version`. Idempotent per gen.
    //! Only the leader `me` may ask. Returns "" or an error (asked again next turn).
    virtual std::string restart(const RestartRequest & r, const std::string & rollout_id, const EtcdLeader & me) = 0;
    //! The latest acknowledgement per node.
    virtual std::map<std::string, RestartAck> acks() = 0;
    //! True when nodes must be restarted from the highest ordinal down in each cell (a
    //! StatefulSet's partition): the rollout picks them in that order.
    virtual bool highest_ordinal_first() const { return false; }
    //! Each turn, the requests the rollout still wants: one queued and not among them is dropped.
    virtual void forget_except(const std::vector<RestartRequest> & /*wanted*/) {}
};

//! The restarter of `armada cluster up`: a request is the key `restart/<node>`, written under
//! the leader's fence; `cluster up` acknowledges under `restarted/<node>`.
class EtcdRestarter : public NodeRestarter {
  public:
    EtcdRestarter(EtcdClient & etcd, const ClusterConfig & cfg) : etcd_(etcd), cfg_(cfg) {}
    std::string restart(const RestartRequest & r, const std::string & rollout_id, const EtcdLeader & me) override;
    std::map<std::string, RestartAck> acks() override;

  private:
    EtcdClient & etcd_;
    const ClusterConfig & cfg_;
};

}  // namespace armada::cluster

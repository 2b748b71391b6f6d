#pragma once

// A rollout's restarts on Kubernetes: the nodes of a cell are the pods of a StatefulSet
// (`armada-node-0`, `armada-node-1`, …), and a rollout drives its RollingUpdate partition.
//
// - Upgrade a pod to V: the pod template gets V (the annotation `armada.dev/version`, the env
//   ARMADA_VERSION_LABEL and, with an image pattern, the image `…:V`), and the partition drops to
//   the pod's ordinal. The StatefulSet controller then replaces that pod, its preStop hook
//   draining it first. Pods are upgraded from the highest ordinal down (the rollout's
//   `ordinal_desc`): lowering the partition past a pod that was not asked for would restart it
//   too, so such a request is refused and the rollout halts, saying why.
// - Roll a pod back to the version of the set's current revision: the partition rises above the
//   pod's ordinal and the pod is deleted; the controller makes it again at the current revision.
// - Requests and acknowledgements live in etcd (`rollout/restart/<node>` under the leader's fence,
//   `rollout/restarted/<node>`), so a global brain that takes over sees what was done.

#include "cluster/restarter.h"

#include <functional>
#include <memory>
#include <string>

namespace armada::cluster {

//! Where the Kubernetes API is and how to reach it.
struct KubeConfig {
    std::string api;         // https://host:port (in a pod: from KUBERNETES_SERVICE_HOST/PORT)
    std::string token;       // the service account's bearer token
    std::string token_file;  // read again before each request when set (bound tokens rotate)
    std::string ca_file;     // the API server's CA (https only)
    std::string ns;          // the namespace of the StatefulSets
    std::string container = "armada";
    //! The image for a version: `{version}` is replaced (e.g. registry/armada:{version}). Empty:
    //! the image stays, and only the version label changes.
    std::string image;
    int timeout_ms = 10000;
};

//! Reads the pod's service account (token, CA, namespace) and the API's address from the
//! environment Kubernetes gives every pod; `image` from the caller. "" or an error.
std::string kube_config_in_pod(KubeConfig & c);

//! Where requests and acknowledgements are kept; etcd in a cluster.
class RestartLedger {
  public:
    virtual ~RestartLedger() = default;
    //! Writes the request, only while `me` leads. "" or an error.
    virtual std::string claim(const RestartRequest & r, const std::string & rollout_id, const EtcdLeader & me) = 0;
    virtual std::string put_ack(const std::string & node, const RestartAck & a) = 0;
    virtual std::map<std::string, RestartAck> acks() = 0;
};

//! The ledger in etcd, under `rollout_prefix`.
class EtcdLedger : public RestartLedger {
  public:
    EtcdLedger(EtcdClient & etcd, const ClusterConfig & cfg) : etcd_(etcd), cfg_(cfg), requests_(etcd, cfg) {}
    std::string claim(const RestartRequest & r, const std::string & rollout_id, const EtcdLeader & me) override {
        return requests_.restart(r, rollout_id, me);
    }
    std::string put_ack(const std::string & node, const RestartAck & a) override;
    std::map<std::string, RestartAck> acks() override { return requests_.acks(); }

  private:
    EtcdClient & etcd_;
    const ClusterConfig & cfg_;
    EtcdRestarter requests_;
};

class KubeRestarter : public NodeRestarter {
  public:
    KubeRestarter(KubeConfig cfg, RestartLedger & ledger, std::function<int64_t()> wall_ms);
    ~KubeRestarter() override;
    std::string restart(const RestartRequest & r, const std::string & rollout_id, const EtcdLeader & me) override;
    std::map<std::string, RestartAck> acks() override { return ledger_.acks(); }
    bool highest_ordinal_first() const override { return true; }

  private:
    //! "" when the pod is on its way to `r.version`; `refused` set for a request that can never
    //! be carried out (the rollout halts on it); else an error worth asking again for.
    std::string act(const RestartRequest & r, bool & refused);

    KubeConfig cfg_;
    RestartLedger & ledger_;
    std::function<int64_t()> wall_ms_;
    struct Tls;
    std::unique_ptr<Tls> tls_;
};

}  // namespace armada::cluster

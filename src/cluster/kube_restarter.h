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
//   Once every pod runs the new version, that revision is the current one, and a StatefulSet
//   cannot take one pod back alone: the template goes back and the partition drops to the pod,
//   so it and every pod above it go back (one at a time, each drained by its preStop hook). The
//   acknowledgement's note says so, and `armada rollout status` shows it.
// - A higher pod that is down or draining on the old version holds the pods below it: the
//   rollout does not pick them (`Rollout`). The restarter still refuses a request out of order.
// - Requests and acknowledgements live in etcd (`rollout/restart/<node>` under the leader's fence,
//   `rollout/restarted/<node>`), so a global brain that takes over sees what was done.
// - The API calls run on a thread of the restarter's own, never on the leader's loop. An answer
//   worth waiting for (a 5xx, a timeout, a controller that has not seen the last change yet) is
//   tried again with backoff, each time under the leader's fence again.

#include "cluster/restarter.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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
    int retry_ms = 1000;  // the first wait before a request is tried again; doubles up to 30 s
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
    //! Writes the acknowledgement, only while `me` leads. "" or an error.
    virtual std::string put_ack(const std::string & node, const RestartAck & a, const EtcdLeader & me) = 0;
    virtual std::map<std::string, RestartAck> acks() = 0;
};

//! The ledger in etcd, under `rollout_prefix`.
class EtcdLedger : public RestartLedger {
  public:
    EtcdLedger(EtcdClient & etcd, const ClusterConfig & cfg) : etcd_(etcd), cfg_(cfg), requests_(etcd, cfg) {}
    std::string claim(const RestartRequest & r, const std::string & rollout_id, const EtcdLeader & me) override {
        return requests_.restart(r, rollout_id, me);
    }
    std::string put_ack(const std::string & node, const RestartAck & a, const EtcdLeader & me) override;
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
    //! Queues the request for the API thread and returns at once; that thread claims it under
    //! the leader's fence before each try. The same gen asked by another term of leadership
    //! goes on under that one.
    std::string restart(const RestartRequest & r, const std::string & rollout_id, const EtcdLeader & me) override;
    //! Drops the queued requests not in `wanted` (the rollout moved on, finished or was aborted).
    void forget_except(const std::vector<RestartRequest> & wanted) override;
    std::map<std::string, RestartAck> acks() override { return ledger_.acks(); }
    bool highest_ordinal_first() const override { return true; }
    //! Waits up to `timeout_ms` until every queued request is acknowledged or dropped; true if so.
    bool wait_idle(int timeout_ms);
    //! The last error of each request still being tried, by node.
    std::map<std::string, std::string> retrying();

  private:
    //! "" when the pod is on its way to `r.version`; `refused` set for a request that can never
    //! be carried out (the rollout halts on it); else an error worth asking again for. `note`:
    //! what else the change does.
    //! `others`: pods that restart with it.
    std::string act(const RestartRequest & r, bool & refused, std::string & note, int & others);
    void work();

    struct Job {
        RestartRequest r;
        std::string rollout_id;
        EtcdLeader me;
        int attempts = 0;
        std::chrono::steady_clock::time_point due;
        std::string last_error;
        std::optional<RestartAck> ack;  // acted on: only its write is left
    };

    KubeConfig cfg_;
    RestartLedger & ledger_;
    std::function<int64_t()> wall_ms_;
    struct Tls;
    std::unique_ptr<Tls> tls_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, Job> jobs_;  // by node: the latest request not done yet
    int busy_ = 0;                     // jobs the API thread works on now
    bool stop_ = false;
    std::thread worker_;  // last: it starts once the rest is built
};

}  // namespace armada::cluster

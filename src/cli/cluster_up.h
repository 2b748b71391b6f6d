#pragma once

#include <string>
#include <vector>

namespace armada::cli {

struct ClusterUpOptions {
    int cells = 1;
    int nodes = 3;     // per cell
    int brains = 2;    // per cell
    int globals = -1;  // global brains; -1: 2 when there are several cells, else none
    int gateways = 1;
    std::string model;
    std::string data_dir = "./armada-cluster";
    //! --data-dir was given: a directory PostgreSQL's user cannot reach is an error. Left to its
    //! default (a checkout under /root), PostgreSQL's data goes where that user can reach it.
    bool data_dir_given = false;
    int port = 8080;  // the gateway's; 0: a free one
    std::string agents_file;
    std::string api_key_file;
    std::string api_key;
    int lease_ttl_s = 5;
    //! PostgreSQL databases the sessions are sharded over (by id), all on the one local server.
    int pg_shards = 1;
    std::string pools_file;                 // `pools:` and `routes:` for the cluster file (GPU pools)
    std::vector<std::string> node_args;     // passed to every `armada serve`
    std::vector<std::string> gateway_args;  // passed to every `armada gateway`
    //! The gateways serve HTTPS with a certificate for localhost and 127.0.0.1 from a CA made in
    //! DATA/tls (ca.crt is what clients trust).
    bool tls = false;
    //! Every process reaches each server through a proxy of this `cluster up`, which hangs it
    //! (accepts, moves no byte) while the file <data-dir>/proxies/<server>.hang exists: a nemesis
    //! makes a dependency hang without stopping it (cluster.json lists them).
    bool fault_proxies = false;
    //! The version every node starts on (`serve --version-label`); empty: Armada's own.
    std::string version_label;
    //! "V=ARG": an argument for every node while it runs version V (repeatable). Rollouts
    //! restart nodes onto other versions: the same binary, labelled and with these arguments.
    std::vector<std::string> version_args;
};

//! `armada cluster up`: a whole cluster on this machine, for trying and testing it. Starts
//! PostgreSQL, etcd, NATS JetStream and Redis from the Debian binaries under one data directory,
//! then the cell brains, the nodes and a gateway, and prints the gateway's URL. It restarts a
//! server that dies (on the same directory and port) at once. An Armada process that crashes
//! (killed by a signal, or a non-zero exit) is started again after a back-off, as a kubelet
//! would: at least twice the lease TTL, so that its cell has failed it over first; one that
//! exits 0 (it drained) stays down. Ctrl-C stops all,
//! in order: gateway, nodes, brains, then the servers. DATA_DIR/cluster.json lists every process.
//! It carries out rollouts' restarts: a global brain (started with `--restarter cluster-up`)
//! writes `<prefix>/rollout/restart/<node>`; the node gets SIGTERM (it drains), starts again on
//! the version asked for after a jittered pause, and `restarted/<node>` says so.
int cluster_up(const ClusterUpOptions & o);

//! `armada cluster forget-leaders --cluster F`: deletes every election's leader mark on every
//! PostgreSQL shard of the cluster file, the recovery after etcd's revisions went backwards.
int forget_leaders(const std::string & cluster_file);

}  // namespace armada::cli

#pragma once

#include "cluster/local_servers.h"

#include <string>

//! The real servers of the cluster adapter tests, started once per test executable (by a
//! GoogleTest environment in servers.cpp) and stopped at its end.
struct ClusterServers {
    armada::cluster::LocalEtcd etcd;
    armada::cluster::LocalDaemon nats{armada::cluster::LocalDaemon::Kind::Nats};
    armada::cluster::LocalDaemon redis{armada::cluster::LocalDaemon::Kind::Redis};
    std::string root;
};
ClusterServers & servers();

#pragma once

// Where each thing of a cluster lives in etcd, built and parsed in one place. Under the
// cluster's prefix P:
//   P/cells/<cell>/nodes/<node>   a node's load, under the node's lease
//   P/cells/<cell>/report         the cell's aggregate, under its leading brain's lease
//   P/cells/<cell>/brain/...      the cell's election (etcd's election, kept as election.h says)
//   P/failovers/<cell>            the cell's recent failovers (no lease)
//   P/global/brain/...            the global brains' election
//   P/global/shares               the split of new sessions (no lease)
//   P/gateways/<name>             a live gateway, under its lease
//   P/rollout/spec|state|command  a rollout
//   P/rollout/restart/<node>      a restart asked for; restarted/<node>: what was done

#include <string>
#include <string_view>

namespace armada::cluster {

class ClusterKeys {
  public:
    //! `prefix` without its trailing slash ("/armada").
    explicit ClusterKeys(std::string prefix) : p_(std::move(prefix)) {}

    std::string cells() const { return p_ + "/cells/"; }
    std::string nodes(const std::string & cell) const { return cells() + cell + "/nodes/"; }
    std::string node(const std::string & cell, const std::string & node) const { return nodes(cell) + node; }
    std::string cell_report(const std::string & cell) const { return cells() + cell + "/report"; }
    std::string cell_election(const std::string & cell) const { return cells() + cell + "/brain"; }
    std::string cell_failovers(const std::string & cell) const { return p_ + "/failovers/" + cell; }
    std::string global_election() const { return p_ + "/global/brain"; }
    std::string shares() const { return p_ + "/global/shares"; }
    std::string gateways() const { return p_ + "/gateways/"; }
    std::string gateway(const std::string & name) const { return gateways() + name; }
    std::string rollout() const { return p_ + "/rollout/"; }
    std::string rollout_state() const { return rollout() + "state"; }
    std::string restart_request(const std::string & node) const { return rollout() + "restart/" + node; }
    std::string restart_ack(const std::string & node) const { return rollout() + "restarted/" + node; }

    //! What a key is, and the names in it. A key outside the layout, or whose names are not valid
    //! cell or node names, is `Other`: any bytes someone put in etcd parse to that.
    struct Parsed {
        enum class Kind {
            Other,
            Node,            // cell, name (the node)
            CellReport,      // cell
            CellElection,    // cell
            CellFailovers,   // cell
            GlobalElection,  //
            Shares,          //
            Gateway,         // name
            RolloutSpec,     //
            RolloutState,    //
            RolloutCommand,  //
            RestartRequest,  // name (the node)
            RestartAck,      // name (the node)
        } kind = Kind::Other;
        std::string cell, name;
    };
    Parsed parse(std::string_view key) const;

    const std::string & prefix() const { return p_; }

  private:
    std::string p_;
};

}  // namespace armada::cluster

#include "cluster/runtime/keys.h"

#include "cluster/cluster_config.h"

namespace armada::cluster {

namespace {

bool eat(std::string_view & s, std::string_view head) {
    if (s.substr(0, head.size()) != head) return false;
    s.remove_prefix(head.size());
    return true;
}

//! A name up to the next '/', taken off `s` with the slash; false when it is not a valid name.
bool name_then_slash(std::string_view & s, std::string & name) {
    const size_t slash = s.find('/');
    if (slash == std::string_view::npos) return false;
    name.assign(s.substr(0, slash));
    s.remove_prefix(slash + 1);
    return valid_cell_or_node_name(name);
}

}  // namespace

ClusterKeys::Parsed ClusterKeys::parse(std::string_view key) const {
    using K = Parsed::Kind;
    Parsed out;
    if (!eat(key, p_) || !eat(key, "/")) return out;
    const auto last = [&](K kind, std::string & into) {
        into.assign(key);
        if (valid_cell_or_node_name(into)) out.kind = kind;
        return out;
    };
    if (eat(key, "cells/")) {
        std::string cell;
        if (!name_then_slash(key, cell)) return out;
        out.cell = cell;
        if (key == "report") {
            out.kind = K::CellReport;
        } else if (key == "brain" || key.substr(0, 6) == "brain/") {
            out.kind = K::CellElection;
        } else if (eat(key, "nodes/")) {
            return last(K::Node, out.name);
        }
        return out;
    }
    if (eat(key, "failovers/")) return last(K::CellFailovers, out.cell);
    if (eat(key, "gateways/")) {
        // A gateway's name is its own (a host name and a pid): any name without a slash.
        if (!key.empty() && key.find('/') == std::string_view::npos) {
            out.kind = K::Gateway;
            out.name.assign(key);
        }
        return out;
    }
    if (key == "global/shares") {
        out.kind = K::Shares;
    } else if (key == "global/brain" || key.substr(0, 13) == "global/brain/") {
        out.kind = K::GlobalElection;
    } else if (eat(key, "rollout/")) {
        if (key == "spec") out.kind = K::RolloutSpec;
        if (key == "state") out.kind = K::RolloutState;
        if (key == "command") out.kind = K::RolloutCommand;
        if (eat(key, "restart/")) return last(K::RestartRequest, out.name);
        if (eat(key, "restarted/")) return last(K::RestartAck, out.name);
    }
    return out;
}

}  // namespace armada::cluster

#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cluster/cell_brain.h"

namespace armada::gateway {

//! A node as the gateway sees it in etcd: its cell and its last load report.
struct NodeView {
    std::string cell;
    cluster::NodeLoad load;
};
using NodeViews = std::map<std::string, NodeView>;

//! The live, non-draining nodes with the most free sequences (all of them on a tie), in one cell
//! when `cell` is given, never one in `avoid` (the nodes a request already tried).
std::vector<std::string> most_room(const NodeViews & nodes, const std::string & cell = {},
                                   const std::set<std::string> & avoid = {});

//! The route template of a request path, for span names and attributes: ids in the path become
//! `{id}` (`/v1/sessions/{id}/events`), so that names stay few.
std::string http_route(const std::string & path);

//! Where a chat turn goes: the node its conversation is bound to while that node is live, not
//! draining and has a free sequence; else the node with most room, round-robin among equals (`rr`
//! is the gateway's counter, advanced only by such a pick: turns that stay do not skew the next
//! new conversation's pick); none when no node takes work.
std::optional<std::string> chat_route(const NodeViews & nodes, const std::optional<std::string> & bound, uint64_t & rr);

}  // namespace armada::gateway

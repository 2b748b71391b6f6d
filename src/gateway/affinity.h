#pragma once

// Chat completions of one conversation go to the node that served its start, where its prompt
// prefix is cached: a hash of the tenant, the model and the first two messages names the
// conversation. With Redis the binding is shared by every gateway; without, each keeps its own.
//
// Owns: the conversation-to-node bindings. It reads the cluster view; it may not relay.

#include "api/auth.h"
#include "api/http_server.h"
#include "cluster/redis.h"
#include "gateway/cluster_view.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace armada::gateway {

class ChatAffinity {
  public:
    //! `redis` may be null; a binding lasts `ttl_s` from the conversation's last turn.
    ChatAffinity(ClusterView & view, cluster::RedisPool * redis, int ttl_s)
        : view_(view), redis_(redis), ttl_ms_(int64_t(ttl_s) * 1000) {}
    //! The node for this chat turn; none when the body is not a chat request (a node answers
    //! it by load) or no node takes work.
    std::optional<std::string> node_for(const api::HttpRequest & req, const api::Caller & caller);

  private:
    ClusterView & view_;
    cluster::RedisPool * redis_;
    int64_t ttl_ms_;
    std::mutex mu_;
    std::map<uint64_t, std::pair<std::string, int64_t>> bound_;  // hash → (node, expiry); mu_
};

}  // namespace armada::gateway

#include "gateway/affinity.h"

#include "common/clock.h"
#include "common/hash.h"

#include <nlohmann/json.hpp>

#include <cstdio>

namespace armada::gateway {

std::optional<std::string> ChatAffinity::node_for(const api::HttpRequest & req, const api::Caller & caller) {
    const auto body = nlohmann::json::parse(req.body, nullptr, false);
    // Anything malformed goes by load: the node answers it with its own 400.
    if (!body.is_object() || !body.contains("messages") || !body["messages"].is_array()) return std::nullopt;
    if (body.contains("model") && !body["model"].is_string()) return std::nullopt;
    std::string text = caller.tenant + "\x1f" + body.value("model", "");
    size_t first = 0;
    for (const auto & m : body["messages"]) {
        if (first++ == 2) break;
        text += "\x1f" + m.dump();
    }
    const uint64_t h = common::fnv1a64(text);
    const int64_t t = common::steady_ms();
    if (redis_) {
        // Shared by every gateway, with a TTL that each turn starts again: the conversation's
        // node, while it has room.
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
        const std::string k = "armada:t:" + caller.tenant + ":affinity:" + hex;
        const auto bound = redis_->get(k, ttl_ms_);
        auto n = view_.chat_route(bound);
        // New, or its node is full, draining or gone: the one by load is remembered.
        if (n && n != bound) redis_->set(k, *n, ttl_ms_);
        return n;
    }
    std::lock_guard lk(mu_);
    std::optional<std::string> bound;
    if (auto it = bound_.find(h); it != bound_.end() && it->second.second > t) bound = it->second.first;
    auto n = view_.chat_route(bound);
    if (!n) return std::nullopt;
    if (bound_.size() > 100000) bound_.clear();
    bound_[h] = {*n, t + ttl_ms_};
    return n;
}

}  // namespace armada::gateway

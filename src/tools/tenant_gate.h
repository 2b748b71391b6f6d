#pragma once

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace armada::tools {

//! A per-tenant limit on asynchronous calls in flight (HTTP tool calls). Calls over the limit
//! wait in their tenant's queue and start, in order, as that tenant's earlier calls end.
class TenantGate {
  public:
    using Release = std::function<void()>;
    explicit TenantGate(int per_tenant, size_t max_queued_per_tenant = 4096)
        : per_tenant_(std::max(1, per_tenant)), max_queued_(max_queued_per_tenant) {}

    //! Runs `fn` now when `tenant` is under its limit, otherwise once a slot frees (on the thread
    //! that frees it). `fn` gets a release it must call exactly once, when its call has ended.
    //! False, and `fn` never runs, when the tenant's queue is full.
    bool enter(const std::string & tenant, std::function<void(Release)> fn);
    int in_flight(const std::string & tenant) const;

  private:
    void leave(const std::string & tenant);
    struct Tenant {
        int running = 0;
        std::deque<std::function<void(Release)>> queue;
    };
    int per_tenant_;
    size_t max_queued_;
    mutable std::mutex mu_;
    std::map<std::string, Tenant> tenants_;  // guarded by mu_
};

}  // namespace armada::tools

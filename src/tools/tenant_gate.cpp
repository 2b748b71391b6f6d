#include "tools/tenant_gate.h"

#include <memory>

namespace armada::tools {

bool TenantGate::enter(const std::string & tenant, std::function<void(Release)> fn) {
    {
        std::lock_guard lk(mu_);
        Tenant & t = tenants_[tenant];
        if (t.running >= per_tenant_) {
            if (t.queue.size() >= max_queued_) return false;
            t.queue.push_back(std::move(fn));
            return true;
        }
        ++t.running;
    }
    // The release may run on any thread, once; a second call is ignored.
    auto once = std::make_shared<std::once_flag>();
    fn([this, tenant, once] { std::call_once(*once, [&] { leave(tenant); }); });
    return true;
}

int TenantGate::in_flight(const std::string & tenant) const {
    std::lock_guard lk(mu_);
    auto it = tenants_.find(tenant);
    return it == tenants_.end() ? 0 : it->second.running;
}

void TenantGate::leave(const std::string & tenant) {
    std::function<void(Release)> next;
    {
        std::lock_guard lk(mu_);
        auto it = tenants_.find(tenant);
        if (it == tenants_.end()) return;
        if (it->second.queue.empty()) {
            if (--it->second.running == 0) tenants_.erase(it);
            return;
        }
        next = std::move(it->second.queue.front());
        it->second.queue.pop_front();
    }
    // The slot passes to the next call of the same tenant.
    auto once = std::make_shared<std::once_flag>();
    next([this, tenant, once] { std::call_once(*once, [&] { leave(tenant); }); });
}

}  // namespace armada::tools

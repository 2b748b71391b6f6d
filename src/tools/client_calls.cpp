#include "tools/client_calls.h"

#include <boost/asio/post.hpp>

namespace armada::tools {

ClientCalls::ClientCalls(int workers, int per_tenant, size_t max_queued_per_tenant)
    : per_tenant_(std::max(1, per_tenant)), max_queued_(max_queued_per_tenant), pool_(size_t(std::max(1, workers))) {}

ClientCalls::~ClientCalls() {
    join();
}

void ClientCalls::join() {
    pool_.join();
}

bool ClientCalls::try_run(const std::string & tenant, std::function<void()> fn) {
    {
        std::lock_guard lk(mu_);
        Tenant & t = tenants_[tenant];
        if (t.running >= per_tenant_) return false;
        ++t.running;
    }
    start(tenant, std::move(fn));
    return true;
}

bool ClientCalls::run(const std::string & tenant, std::function<void()> fn) {
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
    start(tenant, std::move(fn));
    return true;
}

int ClientCalls::running(const std::string & tenant) const {
    std::lock_guard lk(mu_);
    auto it = tenants_.find(tenant);
    return it == tenants_.end() ? 0 : it->second.running;
}

bool ClientCalls::busy() const {
    std::lock_guard lk(mu_);
    return !tenants_.empty();
}

void ClientCalls::start(const std::string & tenant, std::function<void()> fn) {
    boost::asio::post(pool_, [this, tenant, fn = std::move(fn)] {
        fn();
        finished(tenant);
    });
}

void ClientCalls::finished(const std::string & tenant) {
    std::function<void()> next;
    {
        std::lock_guard lk(mu_);
        auto it = tenants_.find(tenant);
        if (it == tenants_.end()) return;
        Tenant & t = it->second;
        if (!t.queue.empty()) {
            next = std::move(t.queue.front());
            t.queue.pop_front();
        } else {
            --t.running;
            if (t.running == 0) tenants_.erase(it);
            return;
        }
    }
    start(tenant, std::move(next));  // the slot passes to the tenant's next call
}

}  // namespace armada::tools

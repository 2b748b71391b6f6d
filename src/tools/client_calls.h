#pragma once

#include <boost/asio/thread_pool.hpp>

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace armada::tools {

//! Worker threads for blocking calls to servers a client named (MCP discovery and tool calls),
//! so none of them runs on an HTTP I/O thread. Each tenant may have at most `per_tenant` calls
//! running; the rest of its calls wait in its own queue, so one tenant's hanging servers hold
//! at most `per_tenant` workers and never delay another tenant's calls beyond that.
class ClientCalls {
  public:
    ClientCalls(int workers, int per_tenant, size_t max_queued_per_tenant = 1024);
    ~ClientCalls();

    //! Runs `fn` on a worker now if the tenant is under its limit; otherwise returns false and
    //! `fn` never runs (interactive requests: the caller answers 429).
    bool try_run(const std::string & tenant, std::function<void()> fn);
    //! Runs `fn` on a worker as soon as the tenant is under its limit (tool calls of sessions).
    //! False only when the tenant's queue is full.
    bool run(const std::string & tenant, std::function<void()> fn);

    int per_tenant() const { return per_tenant_; }
    //! Calls running for `tenant` now (tests, metrics).
    int running(const std::string & tenant) const;
    //! True while any call runs or waits.
    bool busy() const;
    //! Stops taking calls and waits for the running ones.
    void join();

  private:
    void start(const std::string & tenant, std::function<void()> fn);
    void finished(const std::string & tenant);

    struct Tenant {
        int running = 0;
        std::deque<std::function<void()>> queue;
    };
    int per_tenant_;
    size_t max_queued_;
    boost::asio::thread_pool pool_;
    mutable std::mutex mu_;
    std::map<std::string, Tenant> tenants_;  // guarded by mu_
};

}  // namespace armada::tools

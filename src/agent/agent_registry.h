#pragma once

// The agents a node knows, by who may see them:
// - the operator's, from the agents file: every tenant sees them, and none may change them over
//   the API;
// - each tenant's, declared through the API and kept in the store (in a cluster, declared
//   through any node: a node reads the store again at most once a second, and at once for an id
//   it does not know);
// - agents declared before tenants existed, which every tenant sees read-only (kSharedTenant).
// A tenant's own agent shadows a shared one of the same id; an operator agent shadows both.
//
// Owns: the agent maps and their lock. It reads and writes agents through store::Store; the
// session manager writes declarations and deletions, and calls `put_declared` and `erase` once
// they are durable. Its lock is taken inside the session manager's, never around it.

#include "agent/agent_spec.h"
#include "agent/ports.h"
#include "store/store.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace armada::agent {

//! The tenant of agents that every tenant sees, read-only (declared before tenants existed);
//! no caller is ever this tenant.
inline constexpr const char * kSharedTenant = "*";

//! The MCP tools an agent's servers listed, as stored with its declaration ("" when none).
std::string mcp_tools_json(const AgentSpec & a);
//! Puts stored MCP tools back on the agent, with their server's settings. False when they do not
//! fit its servers any more (then the servers are asked again).
bool restore_mcp_tools(AgentSpec & a, const std::string & text);

class AgentRegistry {
  public:
    //! Completes an agent read from the store (lists its MCP servers' tools); an error message
    //! when it cannot.
    using Prepare = std::function<std::string(AgentSpec &)>;

    //! `cluster`: agents may be declared through other nodes, so `sync` reads the store.
    AgentRegistry(store::Store & store, const Clock & clock, bool cluster);

    //! An agent of the operator's file. Replaces one of the same id.
    void put_operator(AgentSpec spec);
    bool is_operator(const std::string & id) const;
    //! A tenant's agent, once its declaration is durable. Counted, so that a sync running
    //! meanwhile does not forget it.
    void put_declared(AgentSpec spec);
    void erase(const std::string & tenant, const std::string & id);
    bool has_declared(const std::string & tenant, const std::string & id) const;

    //! The agent `id` as `tenant` sees it: the operator's, else the tenant's, else a shared one.
    std::shared_ptr<const AgentSpec> lookup(const std::string & tenant, const std::string & id) const;
    //! The agents `tenant` sees; `all_tenants` (an admin): every agent.
    std::vector<AgentSpec> visible(const std::string & tenant, bool all_tenants) const;

    //! Reads the declared agents from the store and keeps each that loads. `prepare` completes
    //! those whose stored tools do not fit (and is kept for later reads). An agent declared before
    //! tenants is stored again as a shared one. `present` gets every stored (tenant, id), loadable
    //! or not; `read_ok` whether the store could be read. Returns how many were kept.
    size_t load(const Prepare & prepare, std::set<std::pair<std::string, std::string>> * present = nullptr,
                bool * read_ok = nullptr);
    //! The `prepare` the last `load` was given.
    Prepare prepare() const;
    //! In a cluster: reads the store again (at most once a second, or every 100 ms when `force`d
    //! for an id not known here), and forgets agents deleted through another node.
    void sync(bool force);

  private:
    store::Store & store_;
    const Clock & clock_;
    const bool cluster_;
    mutable std::mutex mu_;
    std::map<std::string, std::shared_ptr<const AgentSpec>> operator_;                          // by id
    std::map<std::pair<std::string, std::string>, std::shared_ptr<const AgentSpec>> declared_;  // (tenant, id)
    Prepare prepare_;
    std::atomic<int64_t> synced_ms_{0};
    std::atomic<uint64_t> declared_here_{0};  // declarations made here, so a sync never prunes one it did not read
};

}  // namespace armada::agent

#include "agent/agent_registry.h"

#include "common/json_fields.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace armada::agent {

using json = nlohmann::json;

std::string mcp_tools_json(const AgentSpec & a) {
    json arr = json::array();
    for (const auto & t : a.tools) {
        if (t.mcp_url.empty()) continue;
        arr.push_back(
            {{"name", t.name}, {"description", t.description}, {"parameters", t.parameters}, {"mcp_url", t.mcp_url}});
    }
    return arr.empty() ? std::string() : common::json_text(arr);
}

bool restore_mcp_tools(AgentSpec & a, const std::string & text) {
    const json arr = json::parse(text, nullptr, false);
    if (!arr.is_array()) return false;
    for (const auto & t : arr) {
        if (!t.is_object()) return false;
        const std::string url = common::string_field(t, "mcp_url").value_or("");
        auto server = std::find_if(a.mcp_servers.begin(), a.mcp_servers.end(),
                                   [&](const McpServerSpec & m) { return m.url == url; });
        if (server == a.mcp_servers.end()) return false;
        HttpToolSpec h;
        h.name = common::string_field(t, "name").value_or("");
        h.description = common::string_field(t, "description").value_or("");
        h.parameters = common::string_field(t, "parameters").value_or("{}");
        h.url = h.mcp_url = url;
        h.headers = server->headers;
        h.expand_secrets = server->expand_secrets;
        h.follow_redirects = server->follow_redirects;
        h.timeout_ms = server->timeout_ms;
        a.tools.push_back(std::move(h));
    }
    return true;
}

AgentRegistry::AgentRegistry(store::Store & store, const Clock & clock, bool cluster)
    : store_(store), clock_(clock), cluster_(cluster) {}

void AgentRegistry::put_operator(AgentSpec spec) {
    spec.from_operator = true;
    auto p = std::make_shared<const AgentSpec>(std::move(spec));
    std::lock_guard lk(mu_);
    operator_[p->id] = std::move(p);
}

bool AgentRegistry::is_operator(const std::string & id) const {
    std::lock_guard lk(mu_);
    return operator_.count(id) > 0;
}

void AgentRegistry::put_declared(AgentSpec spec) {
    spec.from_operator = false;
    auto p = std::make_shared<const AgentSpec>(std::move(spec));
    std::lock_guard lk(mu_);
    declared_[{p->tenant, p->id}] = std::move(p);
    ++declared_here_;
}

void AgentRegistry::erase(const std::string & tenant, const std::string & id) {
    std::lock_guard lk(mu_);
    declared_.erase({tenant, id});
}

bool AgentRegistry::has_declared(const std::string & tenant, const std::string & id) const {
    std::lock_guard lk(mu_);
    return declared_.count({tenant, id}) > 0;
}

std::shared_ptr<const AgentSpec> AgentRegistry::lookup(const std::string & tenant, const std::string & id) const {
    std::lock_guard lk(mu_);
    if (auto it = operator_.find(id); it != operator_.end()) return it->second;
    if (auto it = declared_.find({tenant, id}); it != declared_.end()) return it->second;
    if (auto it = declared_.find({kSharedTenant, id}); it != declared_.end()) return it->second;
    return nullptr;
}

std::vector<AgentSpec> AgentRegistry::visible(const std::string & tenant, bool all_tenants) const {
    std::lock_guard lk(mu_);
    std::vector<AgentSpec> out;
    for (const auto & [id, a] : operator_)
        out.push_back(*a);
    for (const auto & [key, a] : declared_) {
        const bool shadowed = key.first == kSharedTenant && declared_.count({tenant, key.second});
        if (all_tenants || key.first == tenant || (key.first == kSharedTenant && !shadowed)) out.push_back(*a);
    }
    return out;
}

AgentRegistry::Prepare AgentRegistry::prepare() const {
    std::lock_guard lk(mu_);
    return prepare_;
}

size_t AgentRegistry::load(const Prepare & prepare, std::set<std::pair<std::string, std::string>> * present,
                           bool * read_ok) {
    {
        std::lock_guard lk(mu_);
        prepare_ = prepare;
    }
    size_t n = 0;
    const auto rows = store_.agents();
    if (read_ok) *read_ok = rows.has_value();
    if (!rows) {
        spdlog::warn("cannot read the declared agents from the store; keeping those known");
        return 0;
    }
    for (const auto & r : *rows) {
        // A declaration written before agents were stored as canonical JSON is YAML with every
        // scalar quoted, from before tenants: it is read with its numbers as numbers again, and
        // kept as an agent every tenant sees and only an admin may delete.
        const bool legacy = r.tenant.empty() && !json::parse(r.spec, nullptr, false).is_object();
        // Present even if it cannot be loaded now: a copy already known here stays.
        if (present) present->emplace(legacy ? kSharedTenant : r.tenant, r.id);
        std::vector<AgentSpec> specs;
        if (auto e = parse_agents(r.spec, specs, {.legacy_quoted = legacy}); !e.empty() || specs.size() != 1) {
            spdlog::warn("stored agent {} is not valid any more: {}", r.id, e);
            continue;
        }
        AgentSpec & a = specs[0];
        if (is_operator(a.id)) {
            spdlog::info("agent '{}' comes from the agents file; the one declared through the API is ignored", a.id);
            continue;
        }
        // The tools its MCP servers listed at declaration come back from the store, so a server
        // that is down (or hangs) at a restart neither delays the start nor loses the agent.
        const bool have_tools = !r.tools.empty() && restore_mcp_tools(a, r.tools);
        if (!have_tools && !a.mcp_servers.empty() && prepare) {
            if (auto e = prepare(a); !e.empty()) {
                spdlog::warn("agent '{}': {}; not loaded", a.id, e);
                continue;
            }
        }
        a.tenant = legacy ? kSharedTenant : r.tenant;
        if (legacy) {
            spdlog::warn(
                "agent '{}' was declared before tenants existed; every tenant sees it, read-only, and an "
                "admin key may delete it",
                a.id);
            store::Batch b;
            b.agents.push_back({kSharedTenant, r.id, a.source, mcp_tools_json(a), r.created_ms, r.updated_ms});
            b.erase_agents.emplace_back(r.tenant, r.id);
            if (auto st = store_.commit_sync(std::move(b)); !st.ok)
                spdlog::warn("agent '{}': could not store it in its new form: {}", a.id, st.error);
        }
        auto p = std::make_shared<const AgentSpec>(std::move(a));
        {
            std::lock_guard lk(mu_);
            declared_[{p->tenant, p->id}] = std::move(p);
        }
        ++n;
    }
    return n;
}

void AgentRegistry::sync(bool force) {
    // In a cluster, agents are declared and deleted through any node; the store has them all.
    // One deleted through another node is forgotten here too (its running sessions keep their
    // spec).
    if (!cluster_) return;
    const int64_t now = clock_.now_ms();
    // Forced reads too are spaced (100 ms): requests naming unknown agents must not turn into one
    // store read each.
    if (now - synced_ms_.load() < (force ? 100 : 1000)) return;
    synced_ms_ = now;
    std::set<std::pair<std::string, std::string>> present;
    bool ok = false;
    const uint64_t declared = declared_here_.load();
    load(prepare(), &present, &ok);
    std::lock_guard lk(mu_);
    // An agent declared here while the store was read may be missing from what was read: the
    // next sync prunes instead.
    if (!ok || declared_here_.load() != declared) return;
    for (auto it = declared_.begin(); it != declared_.end();) {
        if (present.count(it->first)) {
            ++it;
            continue;
        }
        spdlog::info("agent '{}' of tenant '{}' was deleted through another node", it->first.second, it->first.first);
        it = declared_.erase(it);
    }
}

}  // namespace armada::agent

#pragma once

#include <cstdint>
#include <string>

namespace armada::cli {

//! `armada sessions|agents|tenants ...` and `armada cluster status`: an operator's verbs against
//! a gateway (or a single node), in the style of kubectl. Tables by default, the API's JSON with
//! `--json`.
struct OperatorOptions {
    std::string resource;  // sessions, agents, tenants, cluster
    std::string verb;      // list, show, events, cancel, apply, delete, create, keys, status
    std::string name;      // a session id, an agent id or a tenant name
    std::string file;      // agents apply -f FILE
    std::string gateway = "http://127.0.0.1:8080";
    std::string api_key;
    std::string cacert;  // a CA file for an https gateway, besides the system's
    bool json = false;
    // sessions list
    std::string state;
    int limit = 50;
    // sessions events
    bool follow = false;
    // tenants create: quotas (0: unlimited)
    int64_t rpm = 0, tpm = 0, live_sessions = 0;
    // tenants keys: make a new key for the tenant
    bool new_key = false;
    int timeout_s = 15;
};

//! Runs one verb; prints what it got, or a clear error (exit 1), or a usage error (exit 2).
int operator_command(const OperatorOptions & o);

}  // namespace armada::cli

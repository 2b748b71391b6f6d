// Agent specs (YAML) as users and POST /v1/agents send them.
#include "agent/agent_spec.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string text(reinterpret_cast<const char *>(data), size);
    std::vector<armada::agent::AgentSpec> agents;
    const std::string err = armada::agent::parse_agents(text, agents);
    if (err.empty()) {
        for (const auto & a : agents) {
            if (a.id.empty()) std::abort();
        }
    }
    return 0;
}

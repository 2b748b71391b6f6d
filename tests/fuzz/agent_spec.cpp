// Agent specs (YAML or JSON) as operators write them and POST /v1/agents sends them. Whatever
// parses must round-trip: an agent stored as its canonical JSON parses again to the same JSON
// (the reload after a restart), and a client's text never turns into a secret reference.
#include "agent/agent_spec.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string text(reinterpret_cast<const char *>(data), size);
    for (bool op : {false, true}) {
        std::vector<armada::agent::AgentSpec> agents;
        const std::string err = armada::agent::parse_agents(text, agents, {.from_operator = op});
        if (!err.empty()) continue;
        for (const auto & a : agents) {
            if (a.id.empty()) std::abort();
            if (!op) {
                for (const auto & t : a.tools) {
                    if (t.expand_secrets) std::abort();
                    for (const auto & [k, v] : t.headers) {
                        if (armada::agent::has_secret_reference(v)) std::abort();
                    }
                }
            }
            std::vector<armada::agent::AgentSpec> again;
            if (!armada::agent::parse_agents(a.source, again, {.from_operator = op}).empty()) std::abort();
            if (again.size() != 1 || again[0].source != a.source || again[0].tools.size() != a.tools.size())
                std::abort();
            for (size_t i = 0; i < a.tools.size(); ++i) {
                if (again[0].tools[i].parameters != a.tools[i].parameters) std::abort();
            }
        }
    }
    return 0;
}

#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace YAML {
class Node;
}

namespace armada::routing {

//! How an upstream constrains output to a schema (a required tool call, `response_format`).
enum class GrammarDialect {
    llama,        // llama.cpp's `grammar` (GBNF) and `json_schema` fields: llama-server, Armada
    json_schema,  // OpenAI's `response_format: {type: json_schema}`: vLLM, SGLang, OpenAI
};

//! One OpenAI-compatible server of a pool (vLLM, SGLang, llama-server on a GPU, another Armada).
struct UpstreamConfig {
    std::string url;           // http://host:port, the base the /v1 routes hang from
    std::string model;         // the model name it serves: every request sent to it says this one
    std::string api_key_env;   // its key comes from this environment variable ...
    std::string api_key_file;  // ... or from this file (first line); neither: no key
    int max_in_flight = 16;    // requests it is sent at once; more wait for another target
    GrammarDialect grammar = GrammarDialect::llama;
    //! It keys its prompt cache by a `cache_salt` field (vLLM): each tenant's requests carry their
    //! own, so one tenant's prompts never speed up (and so reveal themselves to) another's.
    //! Upstreams without it share one cache among tenants (docs/SECURITY.md).
    bool cache_salt = false;
};

//! A pool of upstreams that serve one kind of work (`gpu`, say). Requests go to the upstream
//! with the fewest in flight among those that are healthy and warmed.
struct PoolConfig {
    std::string name;
    std::vector<UpstreamConfig> upstreams;
    int64_t context = 0;      // tokens a request may hold there (prompt + output); 0: not known
    int timeout_ms = 120000;  // a whole answer, or the head of a stream, must come within this
    int health_ms = 2000;     // how often each upstream's /health is read
    //! How often an upstream that is up is checked again (0: health_ms). Not in the file: nodes
    //! set it, since a cluster's every node checks every upstream. Upstreams that are down, or
    //! whose breaker is open, are still probed at health_ms.
    int up_health_ms = 0;
    int breaker_errors = 3;       // failures in a row (errors, timeouts) that open an upstream's breaker
    int breaker_open_ms = 10000;  // how long it stays open before a probe may close it
};

//! A routing rule: when every condition it names holds, the request goes `to` (`cpu` or a pool).
//! Rules are read in order; the first that matches decides, and none matching means `cpu`.
struct RouteRule {
    std::string name;  // for metrics and the route header; default from its conditions
    std::optional<int64_t> prompt_tokens_over;
    std::optional<int64_t> max_tokens_over;
    std::vector<std::string> latency;  // any of these latency classes
    std::vector<std::string> model;    // any of these requested model names
    std::vector<std::string> tenant;   // any of these tenants (a pool of a tenant's own)
    bool long_step = false;            // an agent step its agent marks as long (`long_after_tools`)
    std::string to;
};

//! Pools, routing rules and what they need, from the cluster file.
//!
//!     tokenizer: /models/qwen2.5-7b-instruct-q4_k_m.gguf   # counts prompt tokens (vocabulary only)
//!     pools:
//!       - name: gpu
//!         context: 32768
//!         upstreams:
//!           - {url: http://10.0.0.20:8000, model: Qwen/Qwen2.5-7B-Instruct, api_key_env: VLLM_KEY,
//!              max_in_flight: 64, grammar: json_schema}
//!     routes:
//!       - {when: {prompt_tokens_over: 8192}, to: gpu}
//!     tenant_latency: {acme: interactive}
struct RoutingConfig {
    std::string tokenizer;
    std::vector<PoolConfig> pools;
    std::vector<RouteRule> routes;                      // as written, or the defaults (see below)
    std::map<std::string, std::string> tenant_latency;  // tenant name → its default latency class
    std::string default_latency = "standard";
    //! The classes, most urgent first: a client header may lower its tenant's class, not raise it.
    std::vector<std::string> latency_classes = {"realtime", "interactive", "standard", "batch"};
    //! Tenant name → the most urgent class its clients may ask for with X-Armada-Latency.
    std::map<std::string, std::string> tenant_latency_max;

    //! The class a request of `tenant` runs in: its own (tenant_latency, else default_latency),
    //! or `asked` (X-Armada-Latency) when that is no more urgent than its ceiling
    //! (tenant_latency_max, else its own class) or the caller is an admin. nullopt with `error`
    //! for an unknown class or a raise the tenant may not make.
    std::optional<std::string> latency_for(const std::string & tenant, const std::string & asked, bool admin,
                                           std::string & error) const;

    const PoolConfig * pool(const std::string & name) const;
};

//! The sources' thresholds, used when the file has pools but no `routes:` and a pool is named
//! `gpu`: more than 8K tokens of prompt, more than 500 to generate, or an agent step its agent
//! marks as long, go to `gpu`.
std::vector<RouteRule> default_routes(const std::vector<PoolConfig> & pools);

//! Reads `tokenizer`, `pools`, `routes`, `tenant_latency` and `default_latency` of the cluster
//! file's root map into `out`. False with `error` naming the field.
bool parse_routing(const YAML::Node & root, RoutingConfig & out, std::string & error);

//! The same section as a file of its own (`armada serve --pools FILE` on a single node);
//! `tokenizer` is the default for its `tokenizer:`. The error names the file.
std::optional<RoutingConfig> load_routing_file(const std::string & path, const std::string & tokenizer,
                                               std::string & error);

//! What is known of a request when it is routed. -1: not known.
struct RouteFacts {
    int64_t prompt_tokens = -1;
    int64_t max_tokens = -1;
    std::string latency;
    std::string model;
    bool long_step = false;
    std::string tenant;  // the tenant's name ("" for none)
};

//! The first rule that matches `f` (its target and name), or {"cpu", "default"}.
struct RouteChoice {
    std::string target;
    std::string rule;
};
RouteChoice choose_route(const std::vector<RouteRule> & rules, const RouteFacts & f);

}  // namespace armada::routing

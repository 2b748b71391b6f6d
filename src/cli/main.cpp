// armada: the node binary. Subcommands: serve, topology, mkmodel, bench.
#include "bench/agents_bench.h"
#include "cli/bench_engine.h"
#include "cli/bench_gateway.h"
#include "cli/bench_kv.h"
#include "cli/cell.h"
#include "cli/cell_drain.h"
#include "cli/cluster_up.h"
#include "cli/gateway_command.h"
#include "cli/global.h"
#include "cli/mkmodel.h"
#include "cli/operator.h"
#include "cli/rollout_command.h"
#include "cli/serve.h"
#include "cli/serve_flags.h"
#include "cli/sim_command.h"
#include "cli/tracing.h"
#include "common/cli_exit.h"
#include "engine/memory_budget.h"
#include "gateway/gateway.h"
#include "obs/log.h"
#include "obs/trace.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <csignal>

#include <cstdio>
#include <cstdlib>

using namespace armada;

namespace {

void add_brain_metrics_flags(CLI::App * cmd, std::string & host, int & port) {
    cmd->add_option("--metrics-host", host, "address of the metrics listener")
        ->envname("ARMADA_METRICS_HOST")
        ->capture_default_str();
    cmd->add_option("--metrics-port", port,
                    "serve /metrics and /livez without a key on this port, for Prometheus; 0 = any free port; "
                    "default: none")
        ->check(CLI::Range(0, 65535))
        ->envname("ARMADA_METRICS_PORT");
}

void add_observability_flags(CLI::App * cmd, std::string & endpoint, std::string & log_format) {
    cmd->add_option("--otlp-endpoint", endpoint,
                    "send trace spans to this OTLP/HTTP collector (e.g. http://127.0.0.1:4318); default: "
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT, else none");
    cmd->add_option("--log-format", log_format,
                    "text, or json: one JSON object per line, with session_id and trace_id where known")
        ->check(CLI::IsMember({"text", "json"}))
        ->envname("ARMADA_LOG_FORMAT")
        ->capture_default_str();
}

// llama-server spells some flags with one dash and two letters; CLI11 takes one-letter short
// flags only, so those are rewritten to their long names before parsing.
std::vector<std::string> normalise_args(int argc, char ** argv) {
    static const std::pair<const char *, const char *> aliases[] = {
        {"-np", "--parallel"}, {"-ub", "--ubatch-size"}, {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}};
    std::vector<std::string> out;
    for (int i = 0; i < argc; ++i) {
        std::string a = argv[i];
        for (const auto & [from, to] : aliases) {
            if (a == from) a = to;
        }
        out.push_back(a);
    }
    return out;
}

std::vector<int> parse_list(const std::string & s) {
    std::vector<int> out;
    size_t i = 0;
    while (i < s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        out.push_back(std::stoi(s.substr(i, j - i)));
        i = j + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char ** argv) {
    // A peer that closed its end (a client, a node, Redis through its TLS relay) is an error on
    // that write, never a signal that ends the process.
    std::signal(SIGPIPE, SIG_IGN);
    CLI::App app{"armada: serves LLM agents from CPU nodes (OpenAI-compatible API on llama.cpp)"};
    app.require_subcommand(1);
    std::string otlp_endpoint;  // every long-running process traces and logs the same way
    std::string log_format = "text";
    // As with llama-server, a flag given twice takes its last value.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.set_version_flag("--version", std::string("armada ") + ARMADA_VERSION);

    cli::ServeOptions serve;
    auto * s = app.add_subcommand("serve", "run the node: load a model and serve the HTTP API");
    cli::add_serve_flags(s, serve);
    add_observability_flags(s, otlp_endpoint, log_format);

    cli::CellOptions cell;
    auto * ce = app.add_subcommand("cell", "run a cell brain: places the cell's sessions on its nodes (one leads)");
    ce->add_option("--cluster", cell.cluster_file, "the cluster's YAML file")->required()->envname("ARMADA_CLUSTER");
    ce->add_option("--cell", cell.cell, "the cell to run (required to run a brain)")->envname("ARMADA_CELL");
    ce->add_option("--name", cell.name, "this brain's name in the election (default: HOSTNAME-PID)");
    ce->add_option("--reconcile-ms", cell.reconcile_ms, "how often the view is rebuilt from etcd and PostgreSQL")
        ->check(CLI::Range(200, 600000))
        ->capture_default_str();
    ce->add_option("--log-level", cell.log_level, "trace, debug, info, warn, error")->capture_default_str();
    add_brain_metrics_flags(ce, cell.metrics_host, cell.metrics_port);
    add_observability_flags(ce, otlp_endpoint, log_format);
    cli::DrainOptions drain;
    auto * dr = ce->add_subcommand(
        "drain", "drain a node: it takes nothing new, finishes its running steps and leaves (POST /admin/drain)");
    dr->add_option("node", drain.node, "the node's name in the cluster")->required();
    dr->add_option("--api-key", drain.api_key, "an admin key the node knows")->envname("ARMADA_API_KEY");
    dr->add_flag("--wait", drain.wait, "return once the node has left the cluster");
    dr->add_option("--timeout", drain.timeout_s, "seconds --wait waits at most")
        ->check(CLI::Range(1, 86400))
        ->capture_default_str();
    dr->fallthrough();  // --cluster may follow the node

    cli::GlobalOptions glo;
    auto * gl =
        app.add_subcommand("global", "run a global brain: splits new sessions over cells, re-homes a lost cell");
    gl->add_option("--cluster", glo.cluster_file, "the cluster's YAML file")->required()->envname("ARMADA_CLUSTER");
    gl->add_option("--name", glo.name, "this brain's name in the election (default: HOSTNAME-PID)");
    gl->add_option("--tick-ms", glo.tick_ms, "how often cells are read and lost ones handed over")
        ->check(CLI::Range(100, 60000))
        ->capture_default_str();
    gl->add_option("--shares-ms", glo.shares_ms, "how often the split of new sessions is written")
        ->check(CLI::Range(100, 600000))
        ->capture_default_str();
    gl->add_option("--log-level", glo.log_level, "trace, debug, info, warn, error")->capture_default_str();
    gl->add_option("--restarter", glo.restarter,
                   "how rollouts restart nodes: cluster-up (armada cluster up carries them out), kubernetes "
                   "(each cell's nodes are a StatefulSet's pods; the rollout drives its partition) or none")
        ->check(CLI::IsMember({"none", "cluster-up", "kubernetes"}))
        ->capture_default_str();
    gl->add_option("--kube-image", glo.kube_image,
                   "with --restarter kubernetes: the nodes' image for a version, {version} replaced (e.g. "
                   "registry.example/armada:{version}); unset, only the version label changes");
    add_brain_metrics_flags(gl, glo.metrics_host, glo.metrics_port);
    add_observability_flags(gl, otlp_endpoint, log_format);

    cli::RolloutOptions ro;
    auto * rl = app.add_subcommand("rollout", "a rolling upgrade of the nodes, in waves gated on four signals");
    rl->add_option("--cluster", ro.cluster_file, "the cluster's YAML file")->required()->envname("ARMADA_CLUSTER");
    rl->require_subcommand(1);
    auto * rl_start = rl->add_subcommand(
        "start",
        "start a rollout: every node to --version, wave by wave (a flag not given takes its value from the cluster "
        "file's rollout: section, else the default shown)");
    rl_start->add_option("--version", ro.version, "the version the nodes go to (their --version-label)")->required();
    rl_start->add_option("--wave-percent", ro.wave_percent, "share of the fleet one wave restarts")
        ->check(CLI::Range(0.1, 100.0))
        ->capture_default_str();
    rl_start->add_option("--max-per-cell", ro.max_per_cell, "nodes of one cell restarting at once")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    rl_start->add_option("--settle", ro.settle_s, "seconds each wave is watched before the next")
        ->check(CLI::Range(0, 86400))
        ->capture_default_str();
    rl_start
        ->add_option("--watch-before", ro.watch_before_s,
                     "seconds the fleet is watched before the first wave, for its gates' 'before' (default: the "
                     "settle time, at most 60)")
        ->check(CLI::Range(0, 86400));
    rl_start->add_option("--ready-timeout", ro.ready_timeout_s, "seconds a restarted node has to be back")
        ->check(CLI::Range(1, 86400))
        ->capture_default_str();
    rl_start->add_option("--restarts-per-s", ro.restarts_per_s, "restarts started per second at most")
        ->check(CLI::Range(0.01, 1000.0))
        ->capture_default_str();
    rl_start->add_option("--gate-min-sessions", ro.gate_min_sessions, "sessions ended on a wave to judge success")
        ->capture_default_str();
    rl_start->add_option("--gate-min-steps", ro.gate_min_steps, "steps on a wave to judge latency and errors")
        ->capture_default_str();
    rl_start->add_option("--gate-success-drop", ro.gate_success_drop, "task success drop that halts")
        ->capture_default_str();
    rl_start->add_option("--gate-latency-ratio", ro.gate_latency_ratio, "mean step latency ratio that halts")
        ->capture_default_str();
    rl_start->add_option("--gate-error-ratio", ro.gate_error_ratio, "errors per step ratio that halts")
        ->capture_default_str();
    rl_start->add_option("--gate-error-floor", ro.gate_error_floor, "errors per step added to the ratio's limit")
        ->capture_default_str();
    rl_start
        ->add_option("--gate-heartbeat-excess", ro.gate_heartbeat_excess,
                     "heartbeat anomalies per node-minute above the fleet's that halt")
        ->capture_default_str();
    auto * rl_status = rl->add_subcommand("status", "the rollout's phase, wave, nodes and gates");
    rl_status->add_flag("--json", ro.json, "as JSON");
    auto * rl_pause = rl->add_subcommand("pause", "start no more restarts (those under way finish)");
    auto * rl_resume = rl->add_subcommand("resume", "go on with a paused rollout");
    auto * rl_abort = rl->add_subcommand("abort", "stop the rollout");
    rl_abort->add_flag("--rollback", ro.rollback, "and take every node it upgraded back to its version");
    for (auto * sub : {rl_start, rl_status, rl_pause, rl_resume, rl_abort})
        sub->fallthrough();  // --cluster may follow the action

    gateway::GatewayOptions gwo;
    gwo.http.port = 8080;
    gwo.http.threads = 2;
    auto * gw = app.add_subcommand("gateway", "run a gateway: the single entry of a cluster, with a node's API");
    gw->add_option("--cluster", gwo.cluster_file, "the cluster's YAML file")->required()->envname("ARMADA_CLUSTER");
    gw->add_option("--host", gwo.http.host, "address to bind")->capture_default_str();
    gw->add_option("--port", gwo.http.port, "port to bind (0 = any free port)")->capture_default_str();
    gw->add_option("--http-threads", gwo.http.threads, "HTTP I/O threads")->capture_default_str();
    gw->add_option("--api-key", gwo.api_key, "API key clients must send (admin)")->envname("ARMADA_API_KEY");
    gw->add_option("--api-key-file", gwo.api_key_file, "API keys with tenants, as for serve")
        ->envname("ARMADA_API_KEY_FILE");
    gw->add_option("--cell", gwo.cell, "cell for new sessions (default: the one with the most room)");
    gw->add_option("--name", gwo.name, "this gateway's name among the live ones (default: HOST-PORT)");
    gw->add_option("--affinity-ttl", gwo.affinity_ttl_s, "seconds a conversation stays bound to its node")
        ->capture_default_str();
    gwo.http.header_timeout_s = 10;
    gwo.http.idle_timeout_s = 120;
    gwo.http.max_connections_per_client = 512;
    gw->add_option("--header-timeout", gwo.http.header_timeout_s,
                   "seconds a new connection has to send its first request's headers")
        ->check(CLI::Range(1, 3600))
        ->capture_default_str();
    gw->add_option("--idle-timeout", gwo.http.idle_timeout_s,
                   "seconds a kept-alive connection may wait between requests")
        ->check(CLI::Range(1, 86400))
        ->capture_default_str();
    gw->add_option("--max-connections-per-client", gwo.http.max_connections_per_client,
                   "open connections one client address may hold (0 = no cap); beyond it, 429")
        ->capture_default_str();
    gw->add_option("--max-workers", gwo.max_workers,
                   "requests (and event streams) in progress at once; beyond it, 503 with Retry-After")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();
    gw->add_option("--max-streams-per-tenant", gwo.max_streams_per_tenant,
                   "a tenant's open session event streams through this gateway; beyond it, 429")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();
    gw->add_option("--reads-per-minute", gwo.reads_per_minute,
                   "reads (GET, DELETE, event streams) one key may make a minute across the gateways; beyond it, "
                   "429 (admin keys: no limit; 0: none)")
        ->check(CLI::Range(int64_t(0), int64_t(100000000)))
        ->capture_default_str();
    gw->add_option("--ssl-cert-file", gwo.http.ssl_cert_file, "PEM certificate (chain) for HTTPS");
    gw->add_option("--ssl-key-file", gwo.http.ssl_key_file, "PEM private key for HTTPS");
    gw->add_option("--log-level", gwo.log_level, "trace, debug, info, warn, error")->capture_default_str();
    add_observability_flags(gw, otlp_endpoint, log_format);

    cli::ClusterUpOptions cuo;
    auto * cl = app.add_subcommand("cluster", "a whole cluster on this machine, for trying and testing");
    cl->require_subcommand(1);
    auto * cup = cl->add_subcommand("up", "start PostgreSQL, etcd, NATS, Redis, cell brains, nodes and a gateway");
    cup->add_option("--cells", cuo.cells, "cells")->capture_default_str();
    cup->add_option("--nodes", cuo.nodes, "nodes per cell")->capture_default_str();
    cup->add_option("--brains", cuo.brains, "cell brains per cell (one leads)")->capture_default_str();
    cup->add_option("--globals", cuo.globals, "global brains (one leads); default 2 with several cells, else 0");
    cup->add_option("--gateways", cuo.gateways, "gateways (any of them serves any request)")->capture_default_str();
    cup->add_option("-m,--model", cuo.model, "GGUF model file for every node")->envname("ARMADA_MODEL");
    cup->add_option("--data-dir", cuo.data_dir, "where the servers' data and every log go")->capture_default_str();
    cup->add_option("--port", cuo.port, "the gateway's port (0 = any free port)")->capture_default_str();
    cup->add_option("--agents", cuo.agents_file, "agents file for every node");
    cup->add_option("--api-key-file", cuo.api_key_file, "API keys for the gateway and every node");
    cup->add_option("--api-key", cuo.api_key, "an admin API key for the gateway and every node")
        ->envname("ARMADA_API_KEY");
    cup->add_option("--pg-shards", cuo.pg_shards,
                    "PostgreSQL databases to shard sessions over, by id (1..8; on the one local server)")
        ->check(CLI::Range(1, 8));
    cup->add_option("--lease-ttl", cuo.lease_ttl_s, "seconds before a silent process counts as gone")
        ->check(CLI::Range(1, 60))
        ->capture_default_str();
    cup->add_option("--pools", cuo.pools_file,
                    "a YAML file with the cluster file's pools: and routes: (GPU pools; tokenizer: defaults to -m)")
        ->check(CLI::ExistingFile);
    cup->add_option("--node-arg", cuo.node_args, "an argument for every `armada serve` (repeat it)")
        ->allow_extra_args(false);
    cup->add_option("--gateway-arg", cuo.gateway_args, "an argument for every `armada gateway` (repeat it)")
        ->allow_extra_args(false);
    cup->add_flag("--fault-proxies", cuo.fault_proxies,
                  "reach every server through a proxy that hangs while <data-dir>/proxies/<server>.hang exists "
                  "(fault injection)");
    cup->add_flag("--tls", cuo.tls,
                  "gateways serve HTTPS with a certificate from a CA made in DATA_DIR/tls (clients trust its ca.crt)");
    cup->add_option("--version-label", cuo.version_label,
                    "the version every node starts on (rollouts restart nodes onto others)");
    cup->add_option("--version-arg", cuo.version_args,
                    "V=ARG: an argument for every node while it runs version V (repeat it)")
        ->allow_extra_args(false);

    std::string forget_file;
    auto * cfl = cl->add_subcommand(
        "forget-leaders",
        "after etcd's revisions went backwards (a restore, a new member set): delete every brain's leader mark "
        "in PostgreSQL, so new leaders may write. Stop the brains that led before first");
    cfl->add_option("--cluster", forget_file, "the cluster's YAML file")->required()->envname("ARMADA_CLUSTER");

    // The operator's verbs against a gateway (or one node), kubectl's way.
    cli::OperatorOptions op;
    std::vector<std::pair<CLI::App *, std::string>> op_verbs;  // a leaf, and its resource
    const auto op_common = [&](CLI::App * c) {
        c->add_option("--gateway", op.gateway, "the gateway's URL (or one node's)")
            ->envname("ARMADA_GATEWAY")
            ->capture_default_str();
        c->add_option("--api-key", op.api_key, "the key to use")->envname("ARMADA_API_KEY");
        c->add_option("--cacert", op.cacert, "a CA file to trust for an https gateway, besides the system's");
        c->add_flag("--json", op.json, "print the API's JSON instead of a table");
        c->add_option("--timeout", op.timeout_s, "seconds to wait for the gateway")->capture_default_str();
    };
    const auto op_verb = [&](CLI::App * parent, const std::string & resource, const char * verb, const char * help) {
        auto * c = parent->add_subcommand(verb, help);
        op_common(c);
        op_verbs.emplace_back(c, resource);
        return c;
    };
    auto * ses = app.add_subcommand("sessions", "list, show, follow and cancel agent sessions through a gateway");
    ses->require_subcommand(1);
    auto * ses_list = op_verb(ses, "sessions", "list", "the key's tenant's sessions, newest first");
    ses_list->add_option("--state", op.state, "only those in this state (running, completed, ...)");
    ses_list->add_option("--limit", op.limit, "at most this many (1..1000)")->capture_default_str();
    op_verb(ses, "sessions", "show", "one session")->add_option("id", op.name, "the session's id")->required();
    auto * ses_ev = op_verb(ses, "sessions", "events", "a session's events from its start");
    ses_ev->add_option("id", op.name, "the session's id")->required();
    ses_ev->add_flag("-f,--follow", op.follow,
                     "keep printing events as they come (SSE, as sent), until the stream ends or Ctrl-C");
    op_verb(ses, "sessions", "cancel", "cancel a session")->add_option("id", op.name, "the session's id")->required();
    auto * ags = app.add_subcommand("agents", "list, show, apply and delete agents through a gateway");
    ags->require_subcommand(1);
    op_verb(ags, "agents", "list", "the agents the key's tenant sees");
    op_verb(ags, "agents", "show", "one agent")->add_option("id", op.name, "the agent's id")->required();
    op_verb(ags, "agents", "apply", "declare or replace the agents of a YAML or JSON file")
        ->add_option("-f,--file", op.file, "the agents' YAML or JSON")
        ->required();
    op_verb(ags, "agents", "delete", "delete an agent")->add_option("id", op.name, "the agent's id")->required();
    auto * tns = app.add_subcommand("tenants", "list and create tenants, and their keys, through a gateway (admin)");
    tns->require_subcommand(1);
    op_verb(tns, "tenants", "list", "every tenant with its quotas");
    auto * tn_create = op_verb(tns, "tenants", "create", "a new tenant");
    tn_create->add_option("name", op.name, "the tenant's name")->required();
    tn_create->add_option("--rpm", op.rpm, "requests per minute (0: unlimited)");
    tn_create->add_option("--tpm", op.tpm, "model tokens per minute (0: unlimited)");
    tn_create->add_option("--live-sessions", op.live_sessions, "sessions not yet ended (0: unlimited)");
    auto * tn_keys = op_verb(tns, "tenants", "keys", "a tenant's API keys (ids and prefixes), or a new one");
    tn_keys->add_option("name", op.name, "the tenant's name")->required();
    tn_keys->add_flag("--new", op.new_key, "make a new key for the tenant and print it (once)");
    op_verb(cl, "cluster", "status", "cells, their leaders and nodes, and the rollout, from a gateway (admin)");

    cli::MkModelOptions mk;
    auto * m =
        app.add_subcommand("mkmodel", "write a random-weight qwen2 GGUF of a real shape, for tests and benchmarks");
    m->add_option("--shape", mk.shape, "tiny, small, 0.5b or 7b")->capture_default_str();
    m->add_option("--type", mk.type, "f16, q8_0, q4_0 or q4_k")->capture_default_str();
    m->add_option("-o,--output", mk.output, "output file")->required();
    m->add_option("--seed", mk.seed, "weight seed")->capture_default_str();
    m->add_option("--vocab", mk.vocab, "GGUF to take the tokenizer from (default: llama.cpp's Qwen2 vocab)");
    m->add_option("--template", mk.template_, "Jinja chat template file (default: Qwen2.5-7B-Instruct)");

    struct {
        std::string synthetic, xml;
        cli::PlacementFlags place;
    } topo;
    auto * tp =
        app.add_subcommand("topology", "print the NUMA nodes, cores and memory found, and where engines would run");
    tp->add_option("--synthetic", topo.synthetic,
                   "an hwloc synthetic topology instead of this machine, "
                   "e.g. 'pack:2 numa:2 core:32 pu:1'");
    tp->add_option("--xml", topo.xml, "an hwloc XML topology (lstopo --of xml) instead of this machine");
    tp->add_option("--numa", topo.place.numa, "auto or off, as for serve")->capture_default_str();
    tp->add_option("--cpus", topo.place.cpus, "only these cpus, as for serve");
    tp->add_option("--numa-nodes", topo.place.numa_nodes, "only these NUMA nodes, as for serve");
    tp->add_flag("--smt", topo.place.smt, "use SMT siblings too, as for serve");
    tp->add_option("--engines", topo.place.engines, "engine instances, as for serve");

    auto * b = app.add_subcommand("bench", "benchmarks");
    b->require_subcommand(1);
    cli::BenchGatewayOptions bg;
    auto * bgw = b->add_subcommand("gateway", "latency a gateway adds: the same request to a node and through it");
    bgw->add_option("--gateway", bg.gateway, "the gateway's URL")->required();
    bgw->add_option("--node", bg.node, "a node's URL behind it")->required();
    bgw->add_option("--route", bg.route, "the request's path")->capture_default_str();
    bgw->add_option("--body", bg.body, "a JSON body to POST (default: GET)");
    bgw->add_option("--api-key", bg.api_key, "API key for both")->envname("ARMADA_API_KEY");
    bgw->add_option("-n,--requests", bg.requests, "requests to each side")->capture_default_str();

    cli::BenchEngineOptions be;
    std::string streams = "1,16,64";
    auto * bee = b->add_subcommand("engine", "aggregate decode tokens/s at several concurrent streams");
    bee->add_option("-m,--model", be.model, "GGUF model file")->required();
    bee->add_option("--streams", streams, "comma-separated stream counts")->capture_default_str();
    bee->add_option("-p,--n-prompt", be.n_prompt, "prompt tokens per stream")->capture_default_str();
    bee->add_option("-n,--n-gen", be.n_gen, "generated tokens per stream")->capture_default_str();
    bee->add_option("-d,--depth", be.depth,
                    "tokens each stream already holds; the timed prompt extends them (a later step's prefill)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 20));
    bee->add_option("-t,--threads", be.threads, "compute threads (0 = all cores)")->capture_default_str();
    bee->add_option("--rounds", be.rounds, "alternating rounds of both sides; medians are reported")
        ->capture_default_str();
    bee->add_option("--batched-bench", be.batched_bench, "llama-batched-bench binary to compare against");
    bee->add_option("--llama-bench", be.llama_bench,
                    "llama-bench binary to compare the prompt rate at --depth against (one stream)");
    bee->add_option("--output", be.output, "write a Markdown table here");
    bee->add_option("--grammar", be.grammar, "sample every stream under this GBNF grammar (its cost included)");

    cli::BenchKvOptions bk;
    std::string contexts = "1024,4096,8192";
    auto * bkv = b->add_subcommand("kv", "session memory: resume latency, shared-prefix TTFT, sessions held");
    bkv->add_option("-m,--model", bk.model, "GGUF model file")->required();
    bkv->add_option("--contexts", contexts, "tokens a resumed session holds")->capture_default_str();
    bkv->add_option("--repeats", bk.repeats, "repeats per measurement (medians)")->capture_default_str();
    bkv->add_option("-t,--threads", bk.threads, "compute threads (0 = all cores)")->capture_default_str();
    bkv->add_option("--prefix-tokens", bk.prefix_tokens, "shared prefix length")->capture_default_str();
    bkv->add_option("--sessions", bk.sessions, "sessions in the capacity phase")->capture_default_str();
    bkv->add_option("--session-tokens", bk.session_tokens, "tokens per session there")->capture_default_str();
    bkv->add_option("--seqs", bk.seqs, "sequences of the capacity engine")->capture_default_str();
    bkv->add_option("--kv-budget", bk.budget, "KV budget of the capacity engine")->capture_default_str();
    bkv->add_option("--kv-disk", bk.disk, "disk tier of the capacity engine")->capture_default_str();
    bkv->add_option("--max-rss-overhead-mb", bk.max_rss_overhead_mb,
                    "fail when peak RSS exceeds budget + weights + this many MiB");
    bkv->add_flag("--skip-latency", bk.skip_latency);
    bkv->add_flag("--skip-prefix", bk.skip_prefix);
    bkv->add_flag("--skip-capacity", bk.skip_capacity);
    bkv->add_option("--cache-flood", bk.cache_flood,
                    "then send this many anonymous requests with distinct prompts (no disk tier): the prompt "
                    "cache must stay inside --kv-budget by evicting");
    bool park_only = false;
    bkv->add_flag("--parking-only", park_only, "capacity phase with parking on only");
    bkv->add_option("--dir", bk.dir, "spill directory (default: temporary)");
    bkv->add_option("--output", bk.output, "write a Markdown report here");

    bench::AgentsBenchOptions ba;
    std::string latency = "constant:1";
    auto * bag =
        b->add_subcommand("agents", "agent workload against Armada's sessions API or any OpenAI-compatible server");
    bag->add_option("--target", ba.target, "base URL of the server, e.g. http://127.0.0.1:8080")->required();
    bag->add_option("--mode", ba.mode,
                    "sessions (server-side loop, Armada) or chat (/v1/chat/completions, the bench "
                    "runs the loop)")
        ->capture_default_str();
    bag->add_option("--label", ba.label, "name of the target in reports");
    bag->add_option("--model", ba.model, "model name sent in chat mode");
    bag->add_option("--api-key", ba.api_key, "Bearer key")->envname("ARMADA_API_KEY");
    bag->add_option("--sessions", ba.sessions, "sessions to run")->capture_default_str();
    bag->add_option("--concurrency", ba.concurrency, "closed loop: sessions in flight")->capture_default_str();
    bag->add_option("--rate", ba.rate, "open loop: new sessions per second (overrides --concurrency)");
    bag->add_option("--steps", ba.steps, "tool steps per session (then one answer)")->capture_default_str();
    bag->add_option("--user-turns", ba.user_turns,
                    "chat mode: user messages per conversation, each answered after its tool steps")
        ->capture_default_str();
    bag->add_option("--think", ba.think_s, "chat mode: seconds a user thinks before each later turn")
        ->capture_default_str();
    bag->add_option("--instruction-tokens", ba.instruction_tokens, "shared instruction length (about)")
        ->capture_default_str();
    bag->add_option("--tools", ba.tools, "tool schemas offered")->capture_default_str();
    bag->add_option("--tool-latency", latency, "constant:S, uniform:LO,HI or lognormal:MEAN,SIGMA (seconds)")
        ->capture_default_str();
    bag->add_option("--tool-output-tokens", ba.tool_output_tokens, "tool output length (about)")->capture_default_str();
    bag->add_option("--step-tokens", ba.step_tokens, "max tokens of each tool step")->capture_default_str();
    bag->add_option("--answer-tokens", ba.answer_tokens, "max tokens of the final answer")->capture_default_str();
    bag->add_option("--seed", ba.seed)->capture_default_str();
    bag->add_option("--timeout", ba.timeout_s, "seconds per HTTP exchange")->capture_default_str();
    bag->add_option("--server-pid", ba.server_pid, "sample this process's RSS");
    bag->add_option("--output", ba.output, "write PREFIX.json and PREFIX.md");
    bool no_progress = false;
    bag->add_flag("--no-progress", no_progress);
    std::string preset;
    bag->add_option("--preset", preset, "throughput, mixed or fault (sets the workload; flags given after win)");
    bag->add_option("--kill-after", ba.kill_after_s, "fault test: SIGKILL --server-pid after this many seconds");
    bag->add_option("--restart-cmd", ba.restart_cmd, "fault test: shell command that starts the server again");
    bag->add_option("--retry", ba.retry_s, "retry requests that got no answer for this many seconds");

    std::vector<std::string> plot_files;
    std::string plot_out = "agents";
    auto * bpl = b->add_subcommand("plot", "plot sessions/min and p95 against concurrency from result files (gnuplot)");
    bpl->add_option("files", plot_files, "result JSON files")->required();
    bpl->add_option("-o,--output", plot_out, "output prefix (.svg, .dat, .gp)")->capture_default_str();

    std::string plan_file;
    double water = 200.0 / 350.0;
    int64_t plan_target = 0;
    auto * bpn = b->add_subcommand("plan", "sessions per node at a safe water level, and nodes for a target");
    bpn->add_option("file", plan_file, "result JSON of `bench agents`")->required();
    bpn->add_option("--water-level", water, "share of the measured concurrency to plan for")->capture_default_str();
    bpn->add_option("--target-sessions", plan_target, "concurrent sessions the fleet must hold");
    std::string node_memory;
    bpn->add_option("--node-memory", node_memory,
                    "memory of one node, e.g. 512G (default: this machine's, or its cgroup's)");

    cli::SimCommandOptions simo;
    auto * sm =
        app.add_subcommand("sim", "run a scenario on the real cell and global brains in a deterministic simulator");
    sm->add_option("scenario", simo.scenario, "the scenario's YAML file")->required();
    sm->add_option("--seed", simo.seed, "the random seed (the same seed replays the same run)")->capture_default_str();
    sm->add_option("--seeds", simo.seeds, "a sweep: this many seeds from --seed, checking the invariants")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    sm->add_option("--out", simo.out, "directory for result.json, result.md and plot.svg");
    sm->add_option("--trace", simo.trace, "file for the event trace");
    sm->add_flag("--goals", simo.goals,
                 "check docs/SCALE.md's goals (placement p99, load balance, failover and re-home times, wall "
                 "time), not only the invariants");

    std::vector<std::string> args = normalise_args(argc, argv);
    std::vector<std::string> rev(args.rbegin(), args.rend() - 1);
    try {
        app.parse(std::move(rev));
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    }

    for (const auto & [cmd, service] : {std::pair{s, "armada-node"}, std::pair{ce, "armada-cell"},
                                        std::pair{gl, "armada-global"}, std::pair{gw, "armada-gateway"}}) {
        if (!cmd->parsed()) continue;
        if (log_format == "json") obs::use_json_logs();
        const std::string url = cli::otlp_traces_url(otlp_endpoint, std::getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
                                                     std::getenv("OTEL_EXPORTER_OTLP_ENDPOINT"));
        if (auto e = cli::start_tracing(url, service); !e.empty()) {
            return common::fail(e, 2);
        }
    }
    // Spans still queued when the command returns are sent before the process exits.
    struct FlushSpans {
        ~FlushSpans() { obs::tracer()->flush(); }
    } flush_spans;
    if (s->parsed()) return cli::serve(serve);
    if (dr->parsed()) {
        drain.cluster_file = cell.cluster_file;
        return cli::drain_command(drain);
    }
    if (ce->parsed()) {
        if (cell.cell.empty()) {
            return common::fail("--cell is required to run a cell brain (or ARMADA_CELL)", 2);
        }
        return cli::cell_command(cell);
    }
    if (gl->parsed()) return cli::global_command(glo);
    if (rl->parsed()) {
        for (auto * sub : {rl_start, rl_status, rl_pause, rl_resume, rl_abort})
            if (sub->parsed()) ro.action = sub->get_name();
        // Flags not given come from the cluster file's `rollout:` section.
        for (const CLI::Option * opt : rl_start->get_options())
            if (opt->count() > 0) ro.given.insert(opt->get_name());
        return cli::rollout_command(ro);
    }
    if (gw->parsed()) return cli::gateway_command(gwo);
    if (cup->parsed()) {
        cuo.data_dir_given = cup->count("--data-dir") > 0;
        return cli::cluster_up(cuo);
    }
    if (cfl->parsed()) return cli::forget_leaders(forget_file);
    for (const auto & [leaf, resource] : op_verbs)
        if (leaf->parsed()) {
            op.resource = resource;
            op.verb = leaf->get_name();
            return cli::operator_command(op);
        }
    if (sm->parsed()) return cli::sim_command(simo);
    if (tp->parsed()) return cli::topology_command(topo.synthetic, topo.xml, topo.place);
    if (m->parsed()) {
        const std::string err = cli::write_model(mk);
        if (!err.empty()) {
            return common::fail(err);
        }
        printf("wrote %s (%s, %s)\n", mk.output.c_str(), mk.shape.c_str(), mk.type.c_str());
        return 0;
    }
    if (bag->parsed()) {
        if (auto e = bench::LatencyDist::parse(latency, ba.tool_latency); !e.empty()) {
            return common::fail(e, 2);
        }
        ba.progress = !no_progress;
        if (!preset.empty()) {
            // The preset sets defaults; re-parse so explicit flags override it.
            bench::AgentsBenchOptions keep = ba;
            if (auto e = bench::apply_preset(preset, ba); !e.empty()) {
                return common::fail(e, 2);
            }
            for (const auto * o : bag->get_options()) {
                if (o->count() == 0) continue;
                const std::string n = o->get_name();
                if (n == "--steps") ba.steps = keep.steps;
                if (n == "--instruction-tokens") ba.instruction_tokens = keep.instruction_tokens;
                if (n == "--step-tokens") ba.step_tokens = keep.step_tokens;
                if (n == "--answer-tokens") ba.answer_tokens = keep.answer_tokens;
                if (n == "--tool-latency") ba.tool_latency = keep.tool_latency;
                if (n == "--kill-after") ba.kill_after_s = keep.kill_after_s;
                if (n == "--retry") ba.retry_s = keep.retry_s;
            }
        }
        return bench::agents_bench(ba);
    }
    if (bpl->parsed()) return bench::plot_results(plot_files, plot_out);
    if (bpn->parsed()) {
        uint64_t mem = engine::memory_limit();
        if (!node_memory.empty()) {
            const auto v = engine::parse_size(node_memory);
            if (!v || *v == 0) {
                return common::fail(fmt::format("--node-memory '{}' is not a size (e.g. 512G)", node_memory), 2);
            }
            mem = *v;
        }
        return bench::plan_capacity(plan_file, water, plan_target, mem);
    }
    if (bkv->parsed()) {
        bk.contexts = parse_list(contexts);
        bk.capacity_without_parking = !park_only;
        return cli::bench_kv(bk);
    }
    if (bgw->parsed()) return cli::bench_gateway(bg);
    if (bee->parsed()) {
        be.streams = parse_list(streams);
        return cli::bench_engine(be);
    }
    return 0;
}

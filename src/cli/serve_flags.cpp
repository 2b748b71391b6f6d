#include "cli/serve_flags.h"

#include <CLI/CLI.hpp>

#include <map>
#include <string>

namespace armada::cli {

void add_serve_flags(CLI::App * cmd, ServeOptions & o) {
    cmd->add_option("-m,--model", o.model, "GGUF model file")->envname("ARMADA_MODEL");
    cmd->add_option("-c,--ctx-size", o.engine.n_ctx, "total KV context in tokens, split across sequences")
        ->envname("ARMADA_CTX_SIZE")
        ->capture_default_str();
    cmd->add_option("--parallel", o.engine.n_seq_max, "sequences decoded together, 1..256 (also -np)")
        ->envname("ARMADA_PARALLEL")
        ->capture_default_str();
    cmd->add_option("-t,--threads", o.engine.n_threads, "compute threads (0 = all cores)")
        ->envname("ARMADA_THREADS")
        ->capture_default_str();
    cmd->add_option("-b,--batch-size", o.engine.n_batch, "logical batch size")
        ->envname("ARMADA_BATCH_SIZE")
        ->capture_default_str();
    cmd->add_option("--ubatch-size", o.engine.n_ubatch, "physical batch size (also -ub)")
        ->envname("ARMADA_UBATCH_SIZE")
        ->capture_default_str();
    cmd->add_option("--prompt-chunk", o.engine.chunk, "prompt tokens one sequence may add to one decode step")
        ->envname("ARMADA_PROMPT_CHUNK")
        ->capture_default_str();
    cmd->add_option("--numa", o.place.numa,
                    "auto: one engine per NUMA node when there are several, threads pinned to its cores; off: "
                    "one engine")
        ->envname("ARMADA_NUMA")
        ->capture_default_str();
    cmd->add_option("--cpus", o.place.cpus, "use only these cpus, e.g. 0-15,32-47 (default: the process's cpuset)")
        ->envname("ARMADA_CPUS");
    cmd->add_option("--numa-nodes", o.place.numa_nodes, "use only these NUMA nodes, e.g. 0,1")
        ->envname("ARMADA_NUMA_NODES");
    cmd->add_flag("--smt", o.place.smt, "run compute threads on SMT siblings too (default: one per physical core)")
        ->envname("ARMADA_SMT");
    cmd->add_option("--engines", o.place.engines,
                    "engine instances (default: one per NUMA node under --numa auto, else one); more than the "
                    "nodes splits each node's cores between them")
        ->envname("ARMADA_ENGINES");
    cmd->add_option("--numa-weights", o.numa_weights,
                    "shared: one memory-mapped copy of the weights for every engine; copy: each memory node "
                    "reads its own copy into local memory (more RAM, no remote reads)")
        ->envname("ARMADA_NUMA_WEIGHTS")
        ->capture_default_str();
    cmd->add_flag("--no-pin", o.no_pin, "leave compute threads unpinned, as llama-server does by default")
        ->envname("ARMADA_NO_PIN");
    cmd->add_option("--queue", o.engine.queue_max, "requests that may wait for a free sequence before 429")
        ->envname("ARMADA_QUEUE")
        ->capture_default_str();
    cmd->add_flag("--kv-unified", o.engine.kv_unified, "one KV buffer shared by all sequences")
        ->envname("ARMADA_KV_UNIFIED");
    cmd->add_option("--cache-type-k", o.cache_type_k,
                    "KV cache type for K: f16, f32, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 (also -ctk)")
        ->envname("ARMADA_CACHE_TYPE_K")
        ->capture_default_str();
    cmd->add_option("--cache-type-v", o.cache_type_v, "KV cache type for V, as --cache-type-k (also -ctv)")
        ->envname("ARMADA_CACHE_TYPE_V")
        ->capture_default_str();
    cmd->add_flag("--jump-forward,!--no-jump-forward", o.engine.jump_forward,
                  "feed text a grammar allows only one way (the fixed parts of a tool call) without sampling it")
        ->envname("ARMADA_JUMP_FORWARD")
        ->capture_default_str();
    cmd->add_option("--host", o.http.host, "address to bind")->envname("ARMADA_HOST")->capture_default_str();
    cmd->add_option("--port", o.http.port, "port to bind (0 = any free port)")
        ->envname("ARMADA_PORT")
        ->capture_default_str();
    cmd->add_option("--http-threads", o.http.threads, "HTTP I/O threads")
        ->envname("ARMADA_HTTP_THREADS")
        ->capture_default_str();
    cmd->add_option("--max-body", o.http.max_body, "largest request body in bytes (413 beyond)")
        ->envname("ARMADA_MAX_BODY")
        ->capture_default_str();
    cmd->add_option("--max-connections", o.http.max_connections,
                    "open connections beyond which new ones get 503; 0: the file descriptor limit less 256")
        ->envname("ARMADA_MAX_CONNECTIONS")
        ->capture_default_str();
    cmd->add_option("--api-key", o.api_key,
                    "require this key (Authorization: Bearer KEY) on every route but the probes; it is the "
                    "operator's key (admin)")
        ->envname("ARMADA_API_KEY");
    cmd->add_option("--api-key-file", o.api_key_file,
                    "file of accepted keys, one per line: 'KEY [tenant=NAME] [admin] [rpm=N] [tpm=N]'; a key "
                    "without a tenant is a tenant of its own")
        ->envname("ARMADA_API_KEY_FILE");
    cmd->add_option("--ssl-cert-file", o.http.ssl_cert_file, "serve HTTPS with this PEM certificate (chain)")
        ->envname("ARMADA_SSL_CERT_FILE");
    cmd->add_option("--ssl-key-file", o.http.ssl_key_file, "the PEM private key of --ssl-cert-file")
        ->envname("ARMADA_SSL_KEY_FILE");
    cmd->add_option("--metrics-host", o.metrics_host, "address of the metrics listener")
        ->envname("ARMADA_METRICS_HOST")
        ->capture_default_str();
    cmd->add_option("--metrics-port", o.metrics_port,
                    "serve /metrics (and /livez, /readyz) without a key on this port, for Prometheus; 0 = any "
                    "free port; default: none (the main port's /metrics then needs an admin key when keys are set)")
        ->envname("ARMADA_METRICS_PORT");
    cmd->add_option("--drain-timeout", o.drain_timeout_s,
                    "seconds SIGTERM waits for running steps and completions before stopping anyway")
        ->envname("ARMADA_DRAIN_TIMEOUT")
        ->capture_default_str();
    cmd->add_option("--session-ttl", o.session_ttl,
                    "ended sessions and stored responses are deleted this long after their last change "
                    "(e.g. 30d, 12h; 0 keeps them)")
        ->envname("ARMADA_SESSION_TTL")
        ->capture_default_str();
    cmd->add_option("--tool-ca-file", o.tool_ca_file,
                    "PEM CA certificates trusted for https tools and MCP servers, besides the system store")
        ->envname("ARMADA_TOOL_CA_FILE");
    cmd->add_option("--mcp-workers", o.mcp_workers, "threads that call MCP servers (never the HTTP threads)")
        ->envname("ARMADA_MCP_WORKERS")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    cmd->add_option("--mcp-per-tenant", o.mcp_per_tenant,
                    "MCP calls one tenant may have running; a Responses request over it gets 429")
        ->envname("ARMADA_MCP_PER_TENANT")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    cmd->add_option("--tool-per-tenant", o.tool_per_tenant, "HTTP tool calls one tenant may have in flight")
        ->envname("ARMADA_TOOL_PER_TENANT")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();
    cmd->add_option("--mcp-discover-ms", o.mcp_discover_ms,
                    "time allowed to list an MCP server's tools (a Responses request or POST /v1/agents)")
        ->envname("ARMADA_MCP_DISCOVER_MS")
        ->check(CLI::Range(1, 600000))
        ->capture_default_str();
    cmd->add_option("--rate-limit-rpm", o.rate_rpm,
                    "requests (POSTs) per minute allowed to each API key; 0: unlimited. A key's line in "
                    "--api-key-file may set its own: 'KEY rpm=60 tpm=100000'")
        ->envname("ARMADA_RATE_LIMIT_RPM")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_option("--rate-limit-tpm", o.rate_tpm,
                    "model tokens per minute (uncached prompt + generated) allowed to each API key; 0: unlimited")
        ->envname("ARMADA_RATE_LIMIT_TPM")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_option("--agents", o.agents_file, "YAML file declaring agents (validated at start)")
        ->envname("ARMADA_AGENTS");
    cmd->add_option("--state", o.state,
                    "checkpoint store: sqlite (in --data-dir, the default) or postgres://user@host:port/db, "
                    "comma-separated to shard sessions over several databases");
    cmd->add_option("--pg-pool", o.pg_pool, "PostgreSQL read connections per database, opened at start")
        ->check(CLI::Range(1, 256));
    cmd->add_option("--data-dir", o.data_dir, "where session checkpoints live (SQLite, WAL)")
        ->envname("ARMADA_DATA_DIR")
        ->capture_default_str();
    cmd->add_option("--tool-allow", o.tool_allow,
                    "address range tools may reach although private or loopback, e.g. 127.0.0.1 or 10.0.0.0/8 "
                    "(repeatable)")
        ->envname("ARMADA_TOOL_ALLOW")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->delimiter(',');
    cmd->add_option("--kv-budget", o.kv_budget,
                    "KV memory of the node (context KV + parked sessions in RAM), e.g. 8G; default: RAM or "
                    "cgroup limit minus the weights and 1 GiB")
        ->envname("ARMADA_KV_BUDGET");
    cmd->add_option("--kv-disk", o.kv_disk, "disk space for parked KV spilled from RAM")
        ->envname("ARMADA_KV_DISK")
        ->capture_default_str();
    cmd->add_option("--kv-dir", o.engine.kv_dir, "where parked KV spills (default: DATA_DIR/kv)")
        ->envname("ARMADA_KV_DIR");
    cmd->add_option("--park-grace-ms", o.engine.park_grace_ms,
                    "idle time after which a waiting session's KV is saved to the pool")
        ->envname("ARMADA_PARK_GRACE_MS")
        ->capture_default_str();
    cmd->add_option("--sched", o.engine.sched,
                    "order in which waiting requests get a sequence: fcfs (requests in arrival order), plas (the "
                    "program, i.e. agent session, Responses chain or conversation, with the least service so far "
                    "first) or program-fcfs (the program that arrived first first)")
        ->transform(CLI::CheckedTransformer(
            std::map<std::string, engine::SchedPolicy>{{"plas", engine::SchedPolicy::Plas},
                                                       {"program-fcfs", engine::SchedPolicy::ProgramFcfs},
                                                       {"fcfs", engine::SchedPolicy::Fcfs}}))
        ->envname("ARMADA_SCHED")
        ->default_str("fcfs");
    cmd->add_option("--sched-starve-ms", o.engine.sched_starve_ms,
                    "a request that has waited this long goes ahead of the --sched order (oldest first)")
        ->envname("ARMADA_SCHED_STARVE_MS")
        ->check(CLI::Range(1, 3600 * 1000))
        ->capture_default_str();
    cmd->add_option("--kv-hold-max-ms", o.kv_hold_max_ms,
                    "a session's KV stays in its sequence across a tool call for the time that tool usually "
                    "takes (its p90, learned), up to this; 0: parked after --park-grace-ms")
        ->envname("ARMADA_KV_HOLD_MAX_MS")
        ->check(CLI::Range(int64_t(0), int64_t(600000)))
        ->capture_default_str();
    cmd->add_flag("--no-park", o.no_park, "keep no session KV between requests (re-prefill every step)")
        ->envname("ARMADA_NO_PARK");
    cmd->add_flag("--no-prefix-cache", o.no_prefix_cache,
                  "do not keep finished requests' KV for later requests with the same prompt prefix");
    cmd->add_flag("--no-kv-journal", o.no_kv_journal,
                  "do not write each session's KV to DATA_DIR/kv/journal after every step (a crash then "
                  "re-prefills)")
        ->envname("ARMADA_NO_KV_JOURNAL");
    cmd->add_flag("--kv-journal-sync", o.engine.kv_journal_sync,
                  "fdatasync each journal record: KV survives power loss too, at the cost of a disk flush per step")
        ->envname("ARMADA_KV_JOURNAL_SYNC");
    cmd->add_option("--kv-fingerprint-extra", o.engine.fingerprint_extra,
                    "text added to the KV fingerprint; saved KV with another value is not restored")
        ->envname("ARMADA_KV_FINGERPRINT_EXTRA")
        ->group("");
    cmd->add_option("--log-level", o.log_level, "trace, debug, info, warn, error")
        ->envname("ARMADA_LOG_LEVEL")
        ->capture_default_str();
    cmd->add_option("--cluster", o.cluster_file,
                    "join a cluster: the YAML file naming its etcd, NATS, Redis and PostgreSQL (needs --cell)")
        ->envname("ARMADA_CLUSTER");
    cmd->add_option("--pools", o.pools_file,
                    "GPU pools (YAML: pools, routes) that take this node's heavy agent steps; in a cluster they are "
                    "in the cluster file")
        ->check(CLI::ExistingFile)
        ->envname("ARMADA_POOLS");
    cmd->add_option("--cell", o.cell, "the cell this node joins")->envname("ARMADA_CELL");
    cmd->add_option("--node-name", o.node_name, "this node's name in its cell (default: HOSTNAME-PORT)")
        ->envname("ARMADA_NODE_NAME");
    cmd->add_option("--advertise", o.advertise, "the URL gateways reach this node at (default: http://HOST:PORT)");
    cmd->add_option("--cluster-sessions", o.cluster_sessions, "sessions this node takes from its cell brain")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    cmd->add_option("--kv-rebalance-at", o.kv_rebalance_at,
                    "share of the KV budget in use past which this node offers sessions to nodes with room, "
                    "moving with their KV (0: never)")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    cmd->add_option("--version-label", o.version_label,
                    "the version this node reports to its cell, which rollouts go by (default: Armada's own)")
        ->envname("ARMADA_VERSION_LABEL");
    cmd->add_option("--test-step-errors", o.test_step_errors,
                    "tests only: a finished model step fails with this probability")
        ->check(CLI::Range(0.0, 1.0))
        ->group("");
}

}  // namespace armada::cli

#!/usr/bin/env bash
# What tracing costs an agent workload: the same node (tiny model) and `armada bench agents`
# workload, with spans exported over OTLP/HTTP to a small local collector and without, in
# alternating rounds. Prints each run's figures and the spans the collector took.
#   bench/tracing.sh [ARMADA] [MODEL_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
armada="${1:-build/armada}"; models="${2:-$HOME/.cache/armada/models}"; rounds="${3:-2}"
. bench/lib.sh
dir="$(mktemp -d /tmp/armada-bench-tracing.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
# The collector: takes every POST to /v1/traces and counts the spans in it.
cport=$(free_port)
python3 - "$cport" "$dir/spans" <<'PY' &
import http.server, json, sys
port, out = int(sys.argv[1]), sys.argv[2]
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        global n
        body = json.loads(self.rfile.read(int(self.headers.get('Content-Length', 0))) or b'{}')
        for rs in body.get('resourceSpans', []):
            for ss in rs.get('scopeSpans', []):
                n += len(ss.get('spans', []))
        open(out, 'w').write(str(n))
        self.send_response(200); self.send_header('Content-Type', 'application/json'); self.end_headers()
        self.wfile.write(b'{}')
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('127.0.0.1', port), H).serve_forever()
PY
collector=$!
trap 'kill $collector 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
workload=(--mode sessions --sessions 48 --concurrency 16 --steps 3 --instruction-tokens 300 --tools 4
  --tool-latency constant:0.2 --tool-output-tokens 32 --step-tokens 32 --answer-tokens 16 --seed 42 --no-progress)
echo "+ $armada bench agents --target URL ${workload[*]}"
for r in $(seq 1 "$rounds"); do
  for mode in off on; do
    port=$(free_port)
    env=()
    [ "$mode" = on ] && env=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$cport")
    before=$(cat "$dir/spans" 2>/dev/null || echo 0)
    env "${env[@]}" "$armada" serve -m "$models/armada-tiny-q8_0.gguf" -t 2 -np 16 -c 32768 --port "$port" \
      --data-dir "$dir/data-$r-$mode" --tool-allow 127.0.0.1 > "$dir/serve.log" 2>&1 &
    pid=$!
    wait_ready "http://127.0.0.1:$port" "$pid"
    "$armada" bench agents --target "http://127.0.0.1:$port" "${workload[@]}" --output "$dir/r$r-$mode" > /dev/null
    stop "$pid"
    sleep 1.5  # the last batch of spans
    after=$(cat "$dir/spans" 2>/dev/null || echo 0)
    python3 - "$dir/r$r-$mode.json" "$mode" "$r" "$((after - before))" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))['results']
print(f"round {sys.argv[3]} tracing {sys.argv[2]:3}: sessions/min {r['sessions_per_min']:.1f}, "
      f"session p50/p95 {r['completion_s']['p50']:.2f}/{r['completion_s']['p95']:.2f} s, "
      f"step p50/p95 {r['step_s']['p50']:.3f}/{r['step_s']['p95']:.3f} s, ttft p50 {r['ttft_s']['p50']:.3f} s, "
      f"completed {r['completed']}, spans exported {sys.argv[4]}")
PY
  done
done

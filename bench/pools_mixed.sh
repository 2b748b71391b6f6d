#!/usr/bin/env bash
# A mixed workload through the gateway: light agent sessions (`armada bench agents --mode chat`,
# a client-side tool loop) while a second client keeps sending long-context requests (about
# 3,000 prompt tokens each, a different first word each time so no prompt cache serves them, two
# at a time). Run twice on the same one-node cluster shape:
#   pool: a rule sends prompts over 2,048 tokens to a second `armada serve` (the stand-in pool)
#   cpu:  no pools; the long requests share the CPU node with the light sessions
# and compare the light sessions' p95 (session time and step time). Each server gets one thread,
# so on a 2-core machine the pool run has a core for each process.
# Usage: bench/pools_mixed.sh [ARMADA] [MODEL_DIR] [SESSIONS]
set -euo pipefail
armada="${1:-build/armada}"; models="${2:-$HOME/.cache/armada/models}"; sessions="${3:-24}"
model="$models/armada-tiny-q8_0.gguf"
out="${OUT:-/tmp/armada-pools-mixed}"; mkdir -p "$out"
long_body=$(python3 -c "
import json
print(json.dumps({'messages': [{'role': 'user', 'content': 'SEED ' + ' '.join(['ox'] * 3000)}], 'max_tokens': 16}))")

run() {  # $1: pool|cpu
  local mode=$1 dir; dir="$(mktemp -d /tmp/armada-bench-mixed.XXXXXX)"; chmod 755 "$dir"
  local pool_pid="" up=""
  local extra=()
  if [ "$mode" = pool ]; then
    "$armada" serve -m "$model" --port 0 -np 4 -c 16384 -t 1 > "$dir/pool.log" 2>&1 &
    pool_pid=$!
    for _ in $(seq 1 300); do grep -q "listening on" "$dir/pool.log" && break; sleep 0.2; done
    local pool; pool=$(grep -o 'listening on http://[^ ]*' "$dir/pool.log" | head -1 | cut -d' ' -f3)
    printf "pools:\n  - name: gpu\n    upstreams: [{url: '%s', model: tiny, max_in_flight: 4}]\nroutes:\n  - {when: {prompt_tokens_over: 2048}, to: gpu}\n" \
      "$pool" > "$dir/pools.yaml"
    extra=(--pools "$dir/pools.yaml")
  fi
  "$armada" cluster up --nodes 1 --brains 1 -m "$model" --data-dir "$dir/c" --port 0 "${extra[@]}" \
    --node-arg=-np --node-arg=12 --node-arg=-c --node-arg=49152 --node-arg=-t --node-arg=1 > "$dir/up.log" 2>&1 &
  up=$!
  for _ in $(seq 1 600); do grep -q "gateway at" "$dir/up.log" && break; sleep 0.2; done
  local gw; gw=$(python3 -c "import json;print(json.load(open('$dir/c/cluster.json'))['gateway'])")
  for _ in $(seq 1 600); do curl -sf "$gw/readyz" > /dev/null && break; sleep 0.2; done
  sleep 2
  # The long requests, two loops, until the light run ends.
  local loops=()
  for _ in 1 2; do
    ( while true; do
        curl -s -o /dev/null -w "%{http_code} %{time_total} %header{x-armada-route}\n" "$gw/v1/chat/completions" \
          -H 'content-type: application/json' -d "${long_body/SEED/$RANDOM$RANDOM}" >> "$out/$mode-long.txt" || true
      done ) &
    loops+=($!)
  done
  "$armada" bench agents --target "$gw" --mode chat --label "$mode" --concurrency 8 --sessions "$sessions" \
    --steps 3 --instruction-tokens 300 --step-tokens 24 --answer-tokens 48 --output "$out/$mode" > "$out/$mode.log" 2>&1 || true
  kill "${loops[@]}" 2>/dev/null || true
  wait "${loops[@]}" 2>/dev/null || true
  kill -INT "$up" 2>/dev/null; wait "$up" 2>/dev/null || true
  [ -n "$pool_pid" ] && kill "$pool_pid" 2>/dev/null
  rm -rf "$dir"
}
rm -f "$out"/*-long.txt
run cpu
run pool
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| long requests go to | light sessions/min | light session p95 s | light step p50 s | light step p95 s | long requests done | long p50 s | routes of long requests |")
print("|---|---|---|---|---|---|---|---|")
for mode in ("cpu", "pool"):
    r = json.load(open(f"{out}/{mode}.json"))["results"]
    lines = [l.split() for l in open(f"{out}/{mode}-long.txt") if l.strip()]
    ok = sorted(float(l[1]) for l in lines if l[0] == "200")
    routes = sorted({l[2] if len(l) > 2 else "-" for l in lines})
    p50 = ok[len(ok) // 2] if ok else 0
    print(f"| {mode} | {r['sessions_per_min']:.1f} | {r['completion_s']['p95']:.2f} | {r['step_s']['p50']:.3f} | "
          f"{r['step_s']['p95']:.3f} | {len(ok)} of {len(lines)} | {p50:.2f} | {', '.join(routes)} |")
PY

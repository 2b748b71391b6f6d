#!/usr/bin/env bash
# Armada against llama-server, one after the other, on the same model file, threads and agent
# workload, sweeping concurrency. Prints the ratios, writes JSON/Markdown per run, the plot, and
# the engine ceiling against llama-batched-bench.
#
#   bench/compare.sh                       # small model, concurrency 16 64 256 (make bench)
#   CONCURRENCY="4" SESSIONS_PER=1 STEPS=1 MODEL=…tiny… bench/compare.sh   # smoke
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${HOME}/.cache/armada"
MODEL="${MODEL:-$CACHE/models/armada-small-q8_0.gguf}"
ARMADA="${ARMADA:-build/armada}"
LLAMA_SERVER="${LLAMA_SERVER:-$CACHE/llama.cpp-v0.4.0/bin/llama-server}"
BATCHED_BENCH="${BATCHED_BENCH:-$CACHE/llama.cpp-v0.4.0/bin/llama-batched-bench}"
THREADS="${THREADS:-2}"
CONCURRENCY="${CONCURRENCY:-16 64 256}"
SESSIONS_PER="${SESSIONS_PER:-2}"  # sessions per run = concurrency × this
STEPS="${STEPS:-3}"
CTX_PER="${CTX_PER:-2048}"         # context per session on both sides
STEP_TOKENS="${STEP_TOKENS:-64}"   # max tokens per tool step (the issue's workload says 32)
ENGINE_CEILING="${ENGINE_CEILING:-1}"
ARMADA_FLAGS="${ARMADA_FLAGS:-}"   # extra `armada serve` flags, e.g. --no-pin
OUT="${OUT:-bench/results/$(date -u +%Y%m%d-%H%M)}"
mkdir -p "$OUT"
WORKLOAD=(--steps "$STEPS" --instruction-tokens 700 --tools 4 --tool-latency constant:1 --tool-output-tokens 64
  --step-tokens "$STEP_TOKENS" --answer-tokens 32 --seed 42 --no-progress --timeout 1800)

. bench/lib.sh

echo "model $MODEL, threads $THREADS, concurrency $CONCURRENCY, results in $OUT" | tee "$OUT/flags.txt"
for c in $CONCURRENCY; do
  np=$(( c < 256 ? c : 256 ))
  sessions=$(( c * SESSIONS_PER ))

  # llama-server at its best fair settings: a slot per session, enough context for each, the
  # prompt cache on (default), unified KV with its host-RAM cache (defaults of this build).
  port=$(free_port)
  flags=(-m "$MODEL" -t "$THREADS" -np "$np" -c $(( np * CTX_PER )) --host 127.0.0.1 --port "$port"
    --jinja --cache-prompt -b 2048 -ub 512)
  echo "llama-server ${flags[*]}" | tee -a "$OUT/flags.txt"
  "$LLAMA_SERVER" "${flags[@]}" >"$OUT/llama-server-c$c.log" 2>&1 &
  pid=$!
  wait_ready "http://127.0.0.1:$port" "$pid"
  "$ARMADA" bench agents --target "http://127.0.0.1:$port" --mode chat --label llama-server --concurrency "$c" \
    --sessions "$sessions" --server-pid "$pid" --output "$OUT/llama-server-c$c" "${WORKLOAD[@]}" || true
  stop "$pid"

  # Armada: same model, threads and context per session; the loop runs in the node.
  port=$(free_port)
  data=$(mktemp -d)
  flags=(serve -m "$MODEL" -t "$THREADS" -np "$np" -c $(( np * CTX_PER )) --host 127.0.0.1 --port "$port"
    --data-dir "$data" --tool-allow 127.0.0.1 -b 2048 -ub 512 --queue 4096 $ARMADA_FLAGS)
  echo "armada ${flags[*]}" | tee -a "$OUT/flags.txt"
  "$ARMADA" "${flags[@]}" >"$OUT/armada-c$c.log" 2>&1 &
  pid=$!
  wait_ready "http://127.0.0.1:$port" "$pid"
  "$ARMADA" bench agents --target "http://127.0.0.1:$port" --mode sessions --label armada --concurrency "$c" \
    --sessions "$sessions" --server-pid "$pid" --output "$OUT/armada-c$c" "${WORKLOAD[@]}" || true
  stop "$pid"
  rm -rf "$data"

  python3 - "$OUT" "$c" <<'PY'
import json, sys
out, c = sys.argv[1], sys.argv[2]
a = json.load(open(f"{out}/armada-c{c}.json"))["results"]
l = json.load(open(f"{out}/llama-server-c{c}.json"))["results"]
def ratio(x, y): return x / y if y else float("inf")
line = (f"concurrency {c}: sessions/min armada {a['sessions_per_min']:.2f} / llama-server {l['sessions_per_min']:.2f}"
        f" = {ratio(a['sessions_per_min'], l['sessions_per_min']):.2f}x; p95 armada {a['completion_s']['p95']:.1f} s"
        f" / llama-server {l['completion_s']['p95']:.1f} s = {ratio(a['completion_s']['p95'], l['completion_s']['p95']):.2f}x;"
        f" errors armada {a['errors'] or 'none'}, llama-server {l['errors'] or 'none'}")
print(line)
open(f"{out}/ratios.txt", "a").write(line + "\n")
PY
done

cat "$OUT"/*-c*.md | awk 'NR==1 || !/^\| target|^\|---/' >"$OUT/summary.md"
"$ARMADA" bench plot "$OUT"/*-c*.json -o "$OUT/agents" || true

if [ "$ENGINE_CEILING" = 1 ]; then
  "$ARMADA" bench engine -m "$MODEL" --streams 1,16,64 -p 32 -n 128 -t "$THREADS" --rounds 1 \
    --batched-bench "$BATCHED_BENCH" --output "$OUT/engine.md" | tee "$OUT/engine.txt"
fi
echo "done: $OUT"

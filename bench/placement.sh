#!/usr/bin/env bash
# Placement options side by side: the same agent workload against `armada serve` under each
# set of placement flags, one after the other. On a multi-node server, run it with the NUMA
# variants (see docs/BENCHMARKS.md); on one node it compares pinning and engine counts.
#
#   bench/placement.sh
#   PLACEMENTS=$'--numa off\n--numa auto\n--numa auto --numa-weights copy' bench/placement.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
CACHE="${HOME}/.cache/armada"
MODEL="${MODEL:-$CACHE/models/armada-small-q8_0.gguf}"
ARMADA="${ARMADA:-build/armada}"
CONCURRENCY="${CONCURRENCY:-32}"
SESSIONS="${SESSIONS:-64}"
NP="${NP:-$CONCURRENCY}"
CTX_PER="${CTX_PER:-2048}"
PLACEMENTS="${PLACEMENTS:-$'--no-pin\n--engines 1\n--engines 2'}"
OUT="${OUT:-bench/results/placement-$(date -u +%Y%m%d-%H%M)}"
mkdir -p "$OUT"
WORKLOAD=(--steps 3 --instruction-tokens 700 --tools 4 --tool-latency constant:1 --tool-output-tokens 64
  --step-tokens 64 --answer-tokens 32 --seed 42 --no-progress --timeout 1800)

echo "model $MODEL, concurrency $CONCURRENCY, sessions $SESSIONS, -np $NP" | tee "$OUT/flags.txt"
"$ARMADA" topology | tee "$OUT/topology.txt"
i=0
while IFS= read -r place; do
  [ -n "$place" ] || continue
  i=$((i + 1))
  port=$(free_port)
  data=$(mktemp -d)
  # shellcheck disable=SC2206
  flags=(serve -m "$MODEL" -np "$NP" -c $(( NP * CTX_PER )) --host 127.0.0.1 --port "$port" --data-dir "$data"
    --tool-allow 127.0.0.1 --queue 4096 $place)
  echo "armada ${flags[*]}" | tee -a "$OUT/flags.txt"
  "$ARMADA" "${flags[@]}" >"$OUT/run$i.log" 2>&1 &
  pid=$!
  wait_ready "http://127.0.0.1:$port" "$pid"
  "$ARMADA" bench agents --target "http://127.0.0.1:$port" --mode sessions --label "$place" \
    --concurrency "$CONCURRENCY" --sessions "$SESSIONS" --server-pid "$pid" --output "$OUT/run$i" "${WORKLOAD[@]}" || true
  stop "$pid"
  rm -rf "$data"
done <<<"$PLACEMENTS"

python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
rows = ["| placement flags | sessions/min | p95 session s | step p50 s | gen tok/s | errors |", "|---|---|---|---|---|---|"]
for f in sorted(glob.glob(f"{out}/run*.json")):
    d = json.load(open(f)); r = d["results"]
    rows.append(f"| `{d.get('label', '')}` | {r['sessions_per_min']:.2f} | {r['completion_s']['p95']:.1f} | "
                f"{r['step_s']['p50']:.2f} | {r['generated_tokens_per_s']:.1f} | {r['errors'] or 'none'} |")
open(f"{out}/summary.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
echo "done: $OUT"

#!/usr/bin/env bash
# The simulator's node model against the real node, at 16 and 64 sessions (`armada sim`'s
# calibration in docs/SCALE.md).
#
# 1. The engine's rates come from llama-batched-bench on the same model and threads, with a KV
#    stream per sequence as `armada serve` uses, at the sessions' mean KV length (NPP): the
#    decode rate at 1 sequence and at each concurrency checked, and the prefill rate.
# 2. The real node runs the agents bench (the workload of bench/compare.sh) at each concurrency.
#    Its token counters, read before and after, give the workload's tokens per step: generated,
#    and read (prompt tokens computed, grammar-forced tokens included).
# 3. A scenario of one node with a closed loop of the same sessions goes to `armada sim`, built
#    from those figures only. Its sessions/min is set against the bench's.
#
#   bench/calibrate.sh                          # small model, 16 and 64
#   CONCURRENCY="4" MODEL=…tiny… bench/calibrate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${HOME}/.cache/armada"
MODEL="${MODEL:-$CACHE/models/armada-small-q8_0.gguf}"
ARMADA="${ARMADA:-build/armada}"
BATCHED_BENCH="${BATCHED_BENCH:-$CACHE/llama.cpp-v0.4.0/bin/llama-batched-bench}"
THREADS="${THREADS:-2}"
CONCURRENCY="${CONCURRENCY:-16 64}"
STEPS="${STEPS:-3}"
CTX_PER="${CTX_PER:-2048}"
# The workload's mean KV length: a session's first step reads about 1,300 tokens (instruction,
# tool schemas, template) and its last ends near 1,700 (one session alone reads 1,567 tokens and
# generates 139 in all: the c=1 run's counters).
NPP="${NPP:-1450}"
OUT="${OUT:-bench/results/calibrate-$(date -u +%Y%m%d-%H%M)}"
mkdir -p "$OUT"
WORKLOAD=(--steps "$STEPS" --instruction-tokens 700 --tools 4 --tool-latency constant:1 --tool-output-tokens 64
  --step-tokens 64 --answer-tokens 32 --seed 42 --no-progress --timeout 1800)

. bench/lib.sh

max_c=0
npl=1
for c in $CONCURRENCY; do (( c > max_c )) && max_c=$c; npl="$npl,$c"; done
echo "model $MODEL, threads $THREADS, concurrency $CONCURRENCY, results in $OUT" | tee "$OUT/flags.txt"
"$BATCHED_BENCH" -m "$MODEL" -c $(( (NPP + 64) * max_c + 1024 )) -b 2048 -ub 512 -npp "$NPP" -ntg 64 \
  -npl "$npl" -no-kvu -t "$THREADS" 2>/dev/null | grep -E '^\|' | tee "$OUT/batched.txt"

counters() {  # url -> "prompt generated forced"
  curl -fs "$1/metrics" | awk '
    /^armada_prompt_tokens_total / {p=$2} /^armada_generated_tokens_total / {g=$2}
    /^armada_forced_tokens_total / {f=$2} END {printf "%d %d %d\n", p, g, f}'
}

for c in $CONCURRENCY; do
  port=$(free_port)
  data=$(mktemp -d)
  flags=(serve -m "$MODEL" -t "$THREADS" -np "$c" -c $(( c * CTX_PER )) --host 127.0.0.1 --port "$port"
    --data-dir "$data" --tool-allow 127.0.0.1 -b 2048 -ub 512 --queue 4096)
  echo "armada ${flags[*]}" | tee -a "$OUT/flags.txt"
  "$ARMADA" "${flags[@]}" >"$OUT/armada-c$c.log" 2>&1 &
  pid=$!
  wait_ready "http://127.0.0.1:$port" "$pid"
  counters "http://127.0.0.1:$port" >"$OUT/counters-c$c.txt"
  "$ARMADA" bench agents --target "http://127.0.0.1:$port" --mode sessions --label armada --concurrency "$c" \
    --sessions "$c" --server-pid "$pid" --output "$OUT/armada-c$c" "${WORKLOAD[@]}"
  counters "http://127.0.0.1:$port" >>"$OUT/counters-c$c.txt"
  stop "$pid"
  rm -rf "$data"
done

python3 - "$OUT" "$STEPS" "$CONCURRENCY" <<'EOF'
import json, subprocess, sys
out, steps, conc = sys.argv[1], int(sys.argv[2]), [int(c) for c in sys.argv[3].split()]
rows = [l.split('|')[1:-1] for l in open(f"{out}/batched.txt") if l.startswith('|') and l.split('|')[1].strip().isdigit()]
by_b = {int(r[2]): r for r in rows}
seq = float(by_b[1][7])                  # S_TG t/s, one sequence
full = float(by_b[max(by_b)][7])         # S_TG t/s, the full batch
prefill = float(by_b[max(by_b)][5])      # S_PP t/s
curve = "[" + ", ".join(f"[{b}, {float(by_b[b][7])}]" for b in sorted(by_b)) + "]"
model_steps = steps + 1                  # the tool steps and the answer
lines = [f"engine: decode {curve} (sequences, tok/s), prefill {prefill:.0f} tok/s"]
report = {"engine": {"seq_tokens_per_s": seq, "tokens_per_s": full, "prefill_tokens_per_s": prefill,
                     "decode_curve": curve}, "runs": []}
for c in conc:
    before, after = [list(map(int, l.split())) for l in open(f"{out}/counters-c{c}.txt")]
    real = json.load(open(f"{out}/armada-c{c}.json"))["results"]
    done = real["completed"]
    per_step = model_steps * max(1, done)
    gen = (after[1] - before[1]) / per_step
    read = ((after[0] - before[0]) + (after[2] - before[2])) / per_step
    scenario = f"""# Written by bench/calibrate.sh: one node, the agents bench's closed loop of {c}.
name: calibrate-c{c}
cells: 1
nodes_per_cell: 1
duration_s: 3600
node: {{sessions: {c}, tokens_per_s: {full}, seq_tokens_per_s: {seq}, decode_curve: {curve}, step_tokens: {max(1, round(gen))}, prefill_tokens_per_s: {prefill}, step_prompt_tokens: {round(read)}, cores: 2}}
tenants:
  - {{name: bench, concurrency: {c}, sessions: {c}, steps: {model_steps}, tool_ms: {round(1000 * steps / model_steps)}, think_ms: 0}}
"""
    open(f"{out}/calibrate-c{c}.yaml", "w").write(scenario)
    subprocess.run(["build/armada", "sim", f"{out}/calibrate-c{c}.yaml", "--out", f"{out}/sim-c{c}"],
                   check=True, stdout=subprocess.DEVNULL)
    sim = json.load(open(f"{out}/sim-c{c}/result.json"))
    r, s = real["sessions_per_min"], sim["sessions_per_min"]
    run = {"concurrency": c, "real_sessions_per_min": r, "sim_sessions_per_min": s, "sim_over_real": s / r,
           "gen_tokens_per_step": gen, "read_tokens_per_step": read, "completed": done}
    report["runs"].append(run)
    lines.append(f"concurrency {c}: real {r:.2f} sessions/min, sim {s:.2f} ({100 * (s / r - 1):+.1f}%); "
                 f"per step {gen:.1f} generated, {read:.1f} read")
json.dump(report, open(f"{out}/calibration.json", "w"), indent=2)
print("\n".join(lines))
EOF

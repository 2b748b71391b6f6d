#!/usr/bin/env bash
# The simulator's node model against the real node, at 16 and 64 sessions (`armada sim`'s
# calibration in docs/SCALE.md).
#
# 1. The real node runs the agents bench (the workload of bench/compare.sh) at each concurrency.
#    Its token counters, read before and after, give the workload's tokens per step: sampled
#    (generated less grammar-forced), and read (prompt tokens computed, forced tokens included).
# 2. The engine's rates come from `armada bench engine`, the node's own engine on the same model
#    and threads, with each sequence already holding NPP tokens (the sessions' mean KV length):
#    the decode rate at 1 to 64 sequences (the `decode_curve`), and the rate of a step's new
#    prompt tokens appended at that depth, all sequences at once.
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
THREADS="${THREADS:-2}"
CONCURRENCY="${CONCURRENCY:-16 64}"
STEPS="${STEPS:-3}"
CTX_PER="${CTX_PER:-2048}"
# The workload's mean KV length: a session's first step reads about 1,300 tokens (instruction,
# tool schemas, template) and its last ends near 1,700 (one session alone reads 1,567 tokens and
# generates 139 in all: the c=1 run's counters).
NPP="${NPP:-1450}"
SESSIONS_PER="${SESSIONS_PER:-1}"      # sessions per slot: more than 1 lets their phases spread
TOOL_LATENCY="${TOOL_LATENCY:-constant:1}"
OUT="${OUT:-bench/results/calibrate-$(date -u +%Y%m%d-%H%M)}"
mkdir -p "$OUT"
WORKLOAD=(--steps "$STEPS" --instruction-tokens 700 --tools 4 --tool-latency "$TOOL_LATENCY" --tool-output-tokens 64
  --step-tokens 64 --answer-tokens 32 --seed 42 --no-progress --timeout 1800)

. bench/lib.sh

echo "model $MODEL, threads $THREADS, concurrency $CONCURRENCY, results in $OUT" | tee "$OUT/flags.txt"

counters() {  # url -> "prompt generated forced grammar-fallbacks"
  curl -fs "$1/metrics" | awk '
    /^armada_prompt_tokens_total / {p=$2} /^armada_generated_tokens_total / {g=$2}
    /^armada_forced_tokens_total / {f=$2} /^armada_grammar_fallback_tokens_total / {b=$2}
    END {printf "%d %d %d %d\n", p, g, f, b}'
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
    --sessions $(( c * SESSIONS_PER )) --server-pid "$pid" --output "$OUT/armada-c$c" "${WORKLOAD[@]}"
  counters "http://127.0.0.1:$port" >>"$OUT/counters-c$c.txt"
  stop "$pid"
  rm -rf "$data"
  # The engine at this concurrency: decode from 1 sequence up, and a step's new prompt tokens
  # (the mean read per step, from the counters) appended at depth NPP.
  read_step=$(python3 -c "
import json, sys
b, a = [list(map(int, l.split())) for l in open('$OUT/counters-c$c.txt')]
done = max(1, json.load(open('$OUT/armada-c$c.json'))['results']['completed'])
print(max(16, round(((a[0] - b[0]) + (a[2] - b[2])) / (done * ($STEPS + 1)))))")
  streams=$(python3 -c "print(','.join(str(s) for s in [1, 2, 4, 8, 16, 32, 64, 128, 256] if s < $c) + ',$c')")
  echo "armada bench engine --streams $streams -d $NPP -p $read_step -n 64" | tee -a "$OUT/flags.txt"
  "$ARMADA" bench engine -m "$MODEL" -t "$THREADS" --streams "$streams" -d "$NPP" -p "$read_step" -n 64 --rounds 1 \
    | grep '^median' | tee "$OUT/engine-c$c.txt"
done

python3 - "$OUT" "$STEPS" "$CONCURRENCY" "$SESSIONS_PER" <<'EOF'
import json, re, subprocess, sys
out, steps, conc, per = sys.argv[1], int(sys.argv[2]), [int(c) for c in sys.argv[3].split()], int(sys.argv[4])
model_steps = steps + 1                  # the tool steps and the answer
lines, report = [], {"runs": []}
for c in conc:
    # "median streams=16   armada 299.7 tok/s ... armada prompt 565.2 tok/s"
    eng = {}
    for l in open(f"{out}/engine-c{c}.txt"):
        m = re.match(r"median streams=(\d+)\s+armada ([\d.]+) tok/s.*armada prompt ([\d.]+) tok/s", l)
        if m: eng[int(m[1])] = (float(m[2]), float(m[3]))
    curve = "[" + ", ".join(f"[{b}, {eng[b][0]}]" for b in sorted(eng)) + "]"
    seq, full, prefill = eng[1][0], eng[c][0], eng[c][1]
    before, after = [list(map(int, l.split())) for l in open(f"{out}/counters-c{c}.txt")]
    real = json.load(open(f"{out}/armada-c{c}.json"))["results"]
    done = real["completed"]
    per_step = model_steps * max(1, done)
    # Forced tokens are counted as generated but go to the model as input: read, not sampled.
    sampled = ((after[1] - before[1]) - (after[2] - before[2])) / per_step
    read = ((after[0] - before[0]) + (after[2] - before[2])) / per_step
    scenario = f"""# Written by bench/calibrate.sh: one node, the agents bench's closed loop of {c}.
name: calibrate-c{c}
cells: 1
nodes_per_cell: 1
duration_s: 3600
node: {{sessions: {c}, tokens_per_s: {full}, seq_tokens_per_s: {seq}, decode_curve: {curve}, step_tokens: {max(1, round(sampled))}, prefill_tokens_per_s: {prefill}, step_prompt_tokens: {round(read)}, cores: 2}}
tenants:
  - {{name: bench, concurrency: {c}, sessions: {c * per}, steps: {model_steps}, tool_ms: {round(1000 * steps / model_steps)}, think_ms: 0}}
"""
    open(f"{out}/calibrate-c{c}.yaml", "w").write(scenario)
    subprocess.run(["build/armada", "sim", f"{out}/calibrate-c{c}.yaml", "--out", f"{out}/sim-c{c}"],
                   check=True, stdout=subprocess.DEVNULL)
    sim = json.load(open(f"{out}/sim-c{c}/result.json"))
    r, s = real["sessions_per_min"], sim["sessions_per_min"]
    run = {"concurrency": c, "real_sessions_per_min": r, "sim_sessions_per_min": s, "sim_over_real": s / r,
           "sampled_tokens_per_step": sampled, "read_tokens_per_step": read, "completed": done,
           "engine": {"decode_curve": curve, "prefill_tokens_per_s": prefill}}
    report["runs"].append(run)
    lines.append(f"concurrency {c}: engine decode {curve} (sequences, tok/s), step prefill {prefill:.0f} tok/s")
    lines.append(f"concurrency {c}: real {r:.2f} sessions/min, sim {s:.2f} ({100 * (s / r - 1):+.1f}%); "
                 f"per step {sampled:.1f} sampled, {read:.1f} read")
json.dump(report, open(f"{out}/calibration.json", "w"), indent=2)
print("\n".join(lines))
EOF

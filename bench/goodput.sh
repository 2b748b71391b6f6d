#!/usr/bin/env bash
# Goodput on the live workload: conversations arrive as a Poisson stream at R per second (an open
# loop: the server's speed does not slow the arrivals), each with 3 user turns, 1 tool step and
# an answer per turn, and 8 s of think time before each later turn. Every call is a stateless
# /v1/chat/completions request that resends the conversation, as client-side frameworks send it.
#
# For each server, R goes up the RATES grid; at each R a fresh server takes max(MIN_CONV,
# R x WINDOW) conversations. A rate is met when every conversation completes and the call p95 is
# at most P95_LIMIT seconds. A server's goodput is the highest rate met before its first miss
# (the sweep of that server stops there). Side by side in one run, same model, threads, sequences
# and context per sequence:
#   llama-server (its host-RAM prompt cache, --cache-ram, on), Armada with --sched fcfs, Armada
#   with --sched program-fcfs and with --sched plas.
#
#   bench/goodput.sh
#   RATES="0.05 0.1" WINDOW=20 MODEL=…tiny… bench/goodput.sh      # smoke
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${HOME}/.cache/armada"
MODEL="${MODEL:-$CACHE/models/armada-small-q8_0.gguf}"
ARMADA="${ARMADA:-build/armada}"
LLAMA_SERVER="${LLAMA_SERVER:-$CACHE/llama.cpp-v0.4.0/bin/llama-server}"
THREADS="${THREADS:-2}"
NP="${NP:-16}"
CTX_PER="${CTX_PER:-2048}"
RATES="${RATES:-0.05 0.1 0.15 0.2 0.3 0.4 0.5 0.6 0.8 1.0}"
WINDOW="${WINDOW:-120}"      # seconds of arrivals per rate
MIN_CONV="${MIN_CONV:-12}"
P95_LIMIT="${P95_LIMIT:-10}"
TARGETS="${TARGETS:-llama-server armada-fcfs armada-program-fcfs armada-plas}"
OUT="${OUT:-bench/results/goodput-$(date -u +%Y%m%d-%H%M)}"
mkdir -p "$OUT"
. bench/lib.sh

WORKLOAD=(--mode chat --instruction-tokens 700 --tools 4 --tool-latency constant:1 --tool-output-tokens 64
  --step-tokens 64 --answer-tokens 32 --steps 1 --user-turns 3 --think 8 --no-progress --timeout 600)

echo "model $MODEL, threads $THREADS, -np $NP, rates $RATES, window $WINDOW s, call p95 limit $P95_LIMIT s" |
  tee "$OUT/flags.txt"
for target in $TARGETS; do
  k=0
  for rate in $RATES; do
    k=$((k + 1))
    n=$(python3 -c "import sys; r, w, m = map(float, sys.argv[1:]); print(max(int(m), round(r * w)))" \
      "$rate" "$WINDOW" "$MIN_CONV")
    port=$(free_port)
    data=$(mktemp -d)
    case "$target" in
      llama-server)
        cmd=("$LLAMA_SERVER" -m "$MODEL" -t "$THREADS" -np "$NP" -c $(( NP * CTX_PER )) --host 127.0.0.1
          --port "$port" --jinja --cache-prompt --cache-ram 8192 -b 2048 -ub 512) ;;
      armada-*)
        cmd=("$ARMADA" serve -m "$MODEL" -t "$THREADS" -np "$NP" -c $(( NP * CTX_PER )) --host 127.0.0.1
          --port "$port" --data-dir "$data" -b 2048 -ub 512 --queue 4096 --sched "${target#armada-}") ;;
      *) echo "unknown target $target" >&2; exit 2 ;;
    esac
    [ "$k" = 1 ] && echo "$target: ${cmd[*]}" | tee -a "$OUT/flags.txt"
    "${cmd[@]}" >"$OUT/$target-r$rate.log" 2>&1 &
    pid=$!
    wait_ready "http://127.0.0.1:$port" "$pid"
    # Each rate has conversations of its own (another seed), so no run finds the last one's cache.
    "$ARMADA" bench agents --target "http://127.0.0.1:$port" --label "$target" --rate "$rate" --sessions "$n" \
      --seed $((42 + k)) --server-pid "$pid" --output "$OUT/$target-r$rate" "${WORKLOAD[@]}" || true
    case "$target" in armada-*) curl -fs "http://127.0.0.1:$port/metrics" >"$OUT/$target-r$rate.metrics" || true ;; esac
    stop "$pid"
    rm -rf "$data"
    met=$(python3 - "$OUT/$target-r$rate.json" "$P95_LIMIT" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    print("no"); sys.exit()
r, w = j["results"], j["workload"]
ok = r["completed"] == w["sessions"] and r["step_s"]["p95"] <= float(sys.argv[2])
print("yes" if ok else "no")
PY
)
    echo "$target rate $rate: $n conversations, met: $met" | tee -a "$OUT/flags.txt"
    [ "$met" = yes ] || break
  done
done

python3 - "$OUT" "$P95_LIMIT" $TARGETS <<'PY'
import glob, json, os, re, sys
out, limit, targets = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
rows = {}
for t in targets:
    for p in glob.glob(f"{out}/{t}-r*.json"):
        rate = float(re.search(r"-r([0-9.]+)\.json$", p).group(1))
        j = json.load(open(p))
        r, w = j["results"], j["workload"]
        rows.setdefault(t, []).append({
            "rate": rate, "sessions": w["sessions"], "completed": r["completed"],
            "call_p50": r["step_s"]["p50"], "call_p95": r["step_s"]["p95"],
            "conv_p50": r["completion_s"]["p50"], "conv_p95": r["completion_s"]["p95"],
            "met": r["completed"] == w["sessions"] and r["step_s"]["p95"] <= limit})
    rows.get(t, []).sort(key=lambda x: x["rate"])
goodput = {}
for t, rs in rows.items():
    g = 0.0
    for x in rs:
        if not x["met"]:
            break
        g = x["rate"]
    goodput[t] = g
    if rs and all(x["met"] for x in rs):
        print(f"note: {t} met every rate of the grid; its goodput is at least {g}")
lines = ["| server | rate /s | conversations | completed | call p50 s | call p95 s | conversation p50 s | "
         "conversation p95 s | met |", "|---|---|---|---|---|---|---|---|---|"]
for t, rs in rows.items():
    for x in rs:
        lines.append(f"| {t} | {x['rate']} | {x['sessions']} | {x['completed']} | {x['call_p50']:.2f} | "
                     f"{x['call_p95']:.2f} | {x['conv_p50']:.1f} | {x['conv_p95']:.1f} | {'yes' if x['met'] else 'no'} |")
lines.append("")
base = goodput.get("llama-server", 0)
fcfs = goodput.get("armada-fcfs", 0)
for t, g in goodput.items():
    extra = []
    if base and t != "llama-server":
        extra.append(f"{g / base:.2f}x llama-server")
    if fcfs and t.startswith("armada-") and t != "armada-fcfs":
        extra.append(f"{g / fcfs:.2f}x Armada FCFS")
    lines.append(f"goodput {t}: {g} conversations/s" + (f" ({', '.join(extra)})" if extra else ""))
if fcfs:
    # The second goal's other form: conversation completion p95 at FCFS's goodput.
    for t, rs in rows.items():
        at = [x for x in rs if x["rate"] == fcfs]
        if at and t.startswith("armada-"):
            lines.append(f"conversation p95 of {t} at {fcfs}/s: {at[0]['conv_p95']:.1f} s")
text = "\n".join(lines)
print(text)
open(f"{out}/goodput.md", "w").write(text + "\n")
json.dump({"rows": rows, "goodput": goodput}, open(f"{out}/goodput.json", "w"), indent=1)
# Plot: call p95 and conversation p95 against R, one line per server.
with open(f"{out}/goodput.gp", "w") as gp:
    gp.write(f"set terminal svg size 960,420\nset output '{out}/goodput.svg'\nset multiplot layout 1,2\n"
             "set xlabel 'conversations per second'\nset ylabel 'seconds'\nset key top left\n")
    for col, title in (("call_p95", "call p95"), ("conv_p95", "conversation completion p95")):
        plots = []
        for t, rs in rows.items():
            dat = f"{out}/{t}.dat"
            with open(dat, "w") as d:
                for x in rs:
                    d.write(f"{x['rate']} {x['call_p95']} {x['conv_p95']}\n")
            plots.append(f"'{dat}' using 1:{2 if col == 'call_p95' else 3} with linespoints title '{t}'")
        if col == "call_p95":
            gp.write(f"set title '{title}'\nplot {', '.join(plots)}, {limit} with lines dt 2 title 'limit'\n")
        else:
            gp.write(f"set title '{title}'\nplot {', '.join(plots)}\n")
    gp.write("unset multiplot\n")
os.system(f"gnuplot '{out}/goodput.gp' 2>/dev/null")
PY

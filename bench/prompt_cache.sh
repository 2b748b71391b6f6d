#!/usr/bin/env bash
# The prompt cache, measured as client-side agent frameworks use a server: every step is a
# stateless /v1/chat/completions call that resends the whole conversation. Side by side in one
# run, same model, threads and context per conversation:
#   llama-server (its host-RAM prompt cache, --cache-ram, on: its default and best setting),
#   Armada with the prompt cache, Armada with --no-prefix-cache.
#
#   bench/prompt_cache.sh                          # 16 and 64 conversations, 3 tool steps each
#   WORKLOAD=live bench/prompt_cache.sh            # 300 conversations, 3 user turns, think time
#   CONCURRENCY=4 SESSIONS_PER=1 MODEL=…tiny… bench/prompt_cache.sh    # smoke
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${HOME}/.cache/armada"
MODEL="${MODEL:-$CACHE/models/armada-small-q8_0.gguf}"
ARMADA="${ARMADA:-build/armada}"
LLAMA_SERVER="${LLAMA_SERVER:-$CACHE/llama.cpp-v0.4.0/bin/llama-server}"
THREADS="${THREADS:-2}"
WORKLOAD="${WORKLOAD:-agents}"
CTX_PER="${CTX_PER:-2048}"
TARGETS="${TARGETS:-llama-server armada armada-nocache}"
OUT="${OUT:-bench/results/prompt-cache-$(date -u +%Y%m%d-%H%M)}"
mkdir -p "$OUT"
. bench/lib.sh

if [ "$WORKLOAD" = live ]; then
  # More live conversations than sequences, each with user think time between its turns.
  CONCURRENCY="${CONCURRENCY:-300}"
  SESSIONS_PER="${SESSIONS_PER:-1}"
  NP="${NP:-256}"
  ARGS=(--steps "${STEPS:-1}" --user-turns "${TURNS:-3}" --think "${THINK:-8}")
else
  CONCURRENCY="${CONCURRENCY:-16 64}"
  SESSIONS_PER="${SESSIONS_PER:-2}"
  NP="${NP:-}"
  ARGS=(--steps "${STEPS:-3}")
fi
COMMON=(--mode chat --instruction-tokens 700 --tools 4 --tool-latency constant:1 --tool-output-tokens 64
  --step-tokens 64 --answer-tokens 32 --seed 42 --no-progress --timeout 1800 "${ARGS[@]}")

echo "workload $WORKLOAD, model $MODEL, threads $THREADS, concurrency $CONCURRENCY, results in $OUT" | tee "$OUT/flags.txt"
for c in $CONCURRENCY; do
  np="${NP:-$(( c < 256 ? c : 256 ))}"
  sessions=$(( c * SESSIONS_PER ))
  for target in $TARGETS; do
    port=$(free_port)
    data=$(mktemp -d)
    case "$target" in
      llama-server)
        cmd=("$LLAMA_SERVER" -m "$MODEL" -t "$THREADS" -np "$np" -c $(( np * CTX_PER )) --host 127.0.0.1
          --port "$port" --jinja --cache-prompt --cache-ram 8192 -b 2048 -ub 512) ;;
      armada)
        cmd=("$ARMADA" serve -m "$MODEL" -t "$THREADS" -np "$np" -c $(( np * CTX_PER )) --host 127.0.0.1
          --port "$port" --data-dir "$data" -b 2048 -ub 512 --queue 4096) ;;
      armada-nocache)
        cmd=("$ARMADA" serve -m "$MODEL" -t "$THREADS" -np "$np" -c $(( np * CTX_PER )) --host 127.0.0.1
          --port "$port" --data-dir "$data" -b 2048 -ub 512 --queue 4096 --no-prefix-cache) ;;
      *) echo "unknown target $target" >&2; exit 2 ;;
    esac
    echo "$target: ${cmd[*]}" | tee -a "$OUT/flags.txt"
    "${cmd[@]}" >"$OUT/$target-c$c.log" 2>&1 &
    pid=$!
    wait_ready "http://127.0.0.1:$port" "$pid"
    "$ARMADA" bench agents --target "http://127.0.0.1:$port" --label "$target" --concurrency "$c" \
      --sessions "$sessions" --server-pid "$pid" --output "$OUT/$target-c$c" "${COMMON[@]}" || true
    if [ "$target" = armada ]; then curl -fs "http://127.0.0.1:$port/v1/cache" >"$OUT/armada-c$c-cache.json" || true; fi
    stop "$pid"
    rm -rf "$data"
  done
  python3 - "$OUT" "$c" $TARGETS <<'PY'
import json, os, sys
out, c, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = {}
for t in targets:
    p = f"{out}/{t}-c{c}.json"
    if os.path.exists(p):
        rows[t] = json.load(open(p))["results"]
base = rows.get("llama-server")
for t, r in rows.items():
    spm, p95 = r["sessions_per_min"], r["completion_s"]["p95"]
    call = r.get("step_s", {}).get("p95", float("nan"))
    ratio = f" = {spm / base['sessions_per_min']:.2f}x llama-server" if base and base["sessions_per_min"] else ""
    line = (f"c={c} {t}: {spm:.2f} sessions/min{ratio}; session p95 {p95:.1f} s; call p95 {call:.1f} s;"
            f" errors {r['errors'] or 'none'}")
    print(line)
    open(f"{out}/ratios.txt", "a").write(line + "\n")
PY
done

#!/usr/bin/env bash
# Start-up cost of ended sessions: time from `armada serve` to /readyz 200, and the RSS then,
# with an empty store and with N ended sessions (each a user input, three tool steps, an
# answer and their state steps: 13 steps). Run:
#   ARMADA=build/armada MODEL=~/.cache/armada/models/armada-tiny-q8_0.gguf N=100000 bench/startup.sh
# PROBE=/health measures a build older than /readyz.
set -euo pipefail
armada="${ARMADA:-build/armada}"
model="${MODEL:-$HOME/.cache/armada/models/armada-tiny-q8_0.gguf}"
n="${N:-100000}"
runs="${RUNS:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One start: prints "seconds_to_ready rss_mib".
measure() {
  local dir="$1" p
  p="$(port)"
  local t0; t0="$(date +%s.%N)"
  "$armada" serve -m "$model" --port "$p" -c 2048 -np 2 --data-dir "$dir" >"$work/log" 2>&1 &
  local pid=$!
  until curl -sf "http://127.0.0.1:$p${PROBE:-/readyz}" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { cat "$work/log" >&2; exit 1; }
    sleep 0.02
  done
  local t1; t1="$(date +%s.%N)"
  local rss; rss="$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")"
  kill -TERM "$pid"; wait "$pid" || true
  python3 -c "print(f'{$t1 - $t0:.3f} {$rss / 1024:.1f}')"
}

# The schema comes from armada itself: start once on an empty directory.
mkdir -p "$work/empty" "$work/full"
measure "$work/empty" >/dev/null
cp "$work/empty/armada.db" "$work/full/armada.db"
python3 - "$work/full/armada.db" "$n" <<'PY'
import json, sqlite3, sys, time
db, n = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db)
now = int(time.time() * 1000)
steps = lambda sid: [
    ('user_input', {'content': 'task'}), ('state', {'state': 'running'}),
] + [x for k in range(3) for x in (
    ('model_output', {'step': k + 1, 'content': '', 'tool_calls': [{'id': f'call_{k+1}_0', 'name': 'lookup', 'arguments': '{"record":"alpha"}'}]}),
    ('tool_call', {'step': k + 1, 'id': f'call_{k+1}_0', 'name': 'lookup', 'arguments': '{"record":"alpha"}'}),
    ('state', {'state': 'waiting_tool'}),
    ('tool_result', {'call_id': f'call_{k+1}_0', 'name': 'lookup', 'content': '{"ok":true}', 'is_error': False}),
)] + [('model_output', {'step': 4, 'content': 'done', 'tool_calls': []}), ('state', {'state': 'completed'})]
with c:
    for i in range(n):
        sid = f'sess_bench{i:015d}'
        c.execute('INSERT INTO sessions VALUES(?,?,?,?,?,?,?,?)',
                  (sid, 'worker', '', 'completed', '', json.dumps({'model_steps': 4}), now - 1000, now - 1000))
        c.executemany('INSERT INTO steps VALUES(?,?,?,?,?,?)',
                      [(sid, seq + 1, kind, json.dumps(p), f'{sid}:{seq}:0' if kind.startswith('tool') else '', now - 1000)
                       for seq, (kind, p) in enumerate(steps(sid))])
c.close()
PY
size="$(du -m "$work/full/armada.db" | cut -f1)"
echo "store: $n ended sessions, $size MiB"
echo "| store | run | seconds to /readyz | RSS at ready (MiB) |"
echo "|---|---|---|---|"
for r in $(seq 1 "$runs"); do
  read -r s m < <(measure "$work/empty"); echo "| empty | $r | $s | $m |"
  read -r s m < <(measure "$work/full"); echo "| $n ended | $r | $s | $m |"
done

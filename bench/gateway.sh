#!/usr/bin/env bash
# The latency the gateway adds: `armada cluster up` with one node (tiny model), then
# `armada bench gateway` sends the same small request to the node and through the gateway,
# alternately. Usage: bench/gateway.sh [ARMADA] [MODEL_DIR] [REQUESTS]
set -euo pipefail
armada="${1:-build/armada}"; models="${2:-$HOME/.cache/armada/models}"; n="${3:-2000}"
dir="$(mktemp -d /tmp/armada-bench-gw.XXXXXX)"; chmod 755 "$dir"
"$armada" cluster up --nodes 1 --brains 1 -m "$models/armada-tiny-q8_0.gguf" --data-dir "$dir/c" --port 0 \
  --node-arg=-np --node-arg=4 --node-arg=-c --node-arg=4096 > "$dir/up.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 1 600); do grep -q "gateway at" "$dir/up.log" && break; sleep 0.2; done
gw=$(python3 -c "import json;print(json.load(open('$dir/c/cluster.json'))['gateway'])")
node=$(python3 -c "import json;print([p['url'] for p in json.load(open('$dir/c/cluster.json'))['processes'] if p['role']=='node'][0])")
for u in "$gw" "$node"; do
  for _ in $(seq 1 600); do curl -sf "$u/readyz" > /dev/null && break; sleep 0.2; done
done
echo "+ $armada bench gateway --gateway $gw --node $node -n $n"
"$armada" bench gateway --gateway "$gw" --node "$node" -n "$n"
echo "+ $armada bench gateway --gateway $gw --node $node -n $n --route /v1/chat/completions (max_tokens 1)"
"$armada" bench gateway --gateway "$gw" --node "$node" -n "$((n / 4))" --route /v1/chat/completions \
  --body '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}'

#!/usr/bin/env bash
# What routing to a GPU pool costs: a second `armada serve` stands in for the pool, and
# `armada cluster up --pools` routes `model: long-model` there. `armada bench gateway` then sends
# the same small chat completion to the pool directly and through the gateway (which renders the
# template, counts the prompt's tokens with the model's tokenizer, applies the rules and
# forwards), alternately. With COUNT=0 no rule needs prompt tokens and no tokenizer is loaded,
# which shows what counting costs. Usage: [COUNT=0] bench/pools.sh [ARMADA] [MODEL_DIR] [REQUESTS]
set -euo pipefail
armada="${1:-build/armada}"; models="${2:-$HOME/.cache/armada/models}"; n="${3:-500}"
model="$models/armada-tiny-q8_0.gguf"
dir="$(mktemp -d /tmp/armada-bench-pools.XXXXXX)"; chmod 755 "$dir"
"$armada" serve -m "$model" --port 0 -np 4 -c 4096 -t 1 > "$dir/pool.log" 2>&1 &
pool_pid=$!
trap 'kill -INT ${up:-} 2>/dev/null; wait ${up:-} 2>/dev/null || true; kill $pool_pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 300); do grep -q "listening on" "$dir/pool.log" && break; sleep 0.2; done
pool=$(grep -o 'listening on http://[^ ]*' "$dir/pool.log" | head -1 | cut -d' ' -f3)
cat > "$dir/pools.yaml" <<YAML
pools:
  - name: long
    upstreams: [{url: '$pool', model: armada-tiny-q8_0, max_in_flight: 8}]
routes:
  - {when: {model: long-model}, to: long}
YAML
if [ "${COUNT:-1}" = 1 ]; then
  echo "  - {when: {prompt_tokens_over: 8192}, to: long}" >> "$dir/pools.yaml"
else
  echo "tokenizer: ''" >> "$dir/pools.yaml"
fi
"$armada" cluster up --nodes 1 --brains 1 -m "$model" --data-dir "$dir/c" --port 0 --pools "$dir/pools.yaml" \
  --node-arg=-np --node-arg=4 --node-arg=-c --node-arg=4096 --node-arg=-t --node-arg=1 > "$dir/up.log" 2>&1 &
up=$!
for _ in $(seq 1 600); do grep -q "gateway at" "$dir/up.log" && break; sleep 0.2; done
gw=$(python3 -c "import json;print(json.load(open('$dir/c/cluster.json'))['gateway'])")
for _ in $(seq 1 600); do
  curl -sf "$gw/readyz" | python3 -c "import json,sys;sys.exit(0 if json.load(sys.stdin)['pools']['long']['up']==1 else 1)" \
    2>/dev/null && break
  sleep 0.2
done
[ -n "${HOLD:-}" ] && { echo "gw=$gw pool=$pool"; sleep "$HOLD"; }
body='{"model":"long-model","messages":[{"role":"system","content":"You are a careful planner."},{"role":"user","content":"hi"}],"max_tokens":1}'
echo "+ $armada bench gateway --gateway $gw --node $pool -n $n --route /v1/chat/completions (routed to the pool, max_tokens 1)"
"$armada" bench gateway --gateway "$gw" --node "$pool" -n "$n" --route /v1/chat/completions --body "$body"

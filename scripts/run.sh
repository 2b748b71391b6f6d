#!/usr/bin/env bash
# `make run`: starts the node with its defaults and prints a request that works against it.
set -euo pipefail
armada="$1"; model="$2"; dir="$3"; host="$4"; port="$5"
if [ -z "$model" ]; then
  model="$dir/armada-small-q8_0.gguf"
  echo "MODEL not set: using the demo model $model (random weights: its text is noise)"
fi
cat <<TXT

Once it says ready, try in another shell:

  curl -s http://$host:$port/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'

TXT
exec "$armada" serve -m "$model" --host "$host" --port "$port" -c 8192 -np 8

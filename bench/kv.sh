#!/usr/bin/env bash
# `make bench`: session memory on the small and 0.5b models (resume latency, shared-prefix TTFT,
# sessions held at a fixed budget with parking on and off). Writes docs/bench-kv-<model>.md.
set -euo pipefail
armada="$1"; models="$2"
threads="${BENCH_THREADS:-$(nproc)}"
[ -s "$models/armada-0.5b-q8_0.gguf" ] || "$armada" mkmodel --shape 0.5b --type q8_0 -o "$models/armada-0.5b-q8_0.gguf"
run() { echo "+ $*"; "$@"; }
run "$armada" bench kv -m "$models/armada-small-q8_0.gguf" -t "$threads" --repeats 3 --sessions 2000 \
  --session-tokens 128 --seqs 16 --kv-budget 2G --output docs/bench-kv-small.md
run "$armada" bench kv -m "$models/armada-0.5b-q8_0.gguf" -t "$threads" --repeats 1 --skip-capacity \
  --output docs/bench-kv-0.5b.md

#!/usr/bin/env bash
# `make bench`: the engine ceiling against llama-batched-bench on the same model and threads.
# Prints medians of alternating rounds and writes the table to docs/bench-engine.md.
set -euo pipefail
armada="$1"; models="$2"; llama_dir="$3"
model="${BENCH_MODEL:-$models/armada-small-q8_0.gguf}"
threads="${BENCH_THREADS:-$(nproc)}"
cmd=("$armada" bench engine -m "$model" --streams 1,16,64 -p 32 -n 128 -t "$threads" --rounds 3
     --batched-bench "$llama_dir/bin/llama-batched-bench" --output docs/bench-engine.md)
echo "+ ${cmd[*]}"
"${cmd[@]}"
# The prompt rate at depth: 32 tokens appended to a sequence of 1,024, against llama-bench's
# `-p 32 -d 1024` on the same model and threads.
cmd=("$armada" bench engine -m "$model" --streams 1 -p 32 -n 4 -d 1024 -t "$threads" --rounds 3
     --llama-bench "$llama_dir/bin/llama-bench")
echo "+ ${cmd[*]}"
"${cmd[@]}"

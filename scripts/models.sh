#!/usr/bin/env bash
# Makes the random-weight test and demo models once; later runs reuse them.
set -euo pipefail
armada="$1"
dir="$2"
mkdir -p "$dir"
make_one() {
  local shape="$1" type="$2" out="$dir/armada-$1-$2.gguf"
  if [ ! -s "$out" ]; then
    "$armada" mkmodel --shape "$shape" --type "$type" -o "$out"
  fi
}
make_one tiny q8_0
make_one small q8_0

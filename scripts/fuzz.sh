#!/usr/bin/env bash
# `make fuzz`: builds the fuzz targets with clang's libFuzzer (plus ASan and UBSan) and runs each
# for a set time, starting from its seed corpus in tests/fuzz/<target>/. New interesting inputs
# go to BUILD/corpus/<target>/; crashes go to BUILD/findings/<target>/ and are listed at the end.
# FUZZ_TARGETS="a b" limits the run to some targets.
# A crash found here is fixed, and its input is copied into tests/fuzz/<target>/ so ctest replays
# it on every run.
set -euo pipefail
build="$1"; llama="$2"; models="$3"; seconds="$4"; jobs="${5:-2}"
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "make fuzz needs clang (apt-get install clang)" >&2; exit 1; }
CC=clang CXX=clang++ cmake -S . -B "$build" -DLLAMA_DIR="$llama" -DARMADA_SANITIZE=fuzzer \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets="${FUZZ_TARGETS:-$(sed -n 's/^set(FUZZ_TARGETS \(.*\))$/\1/p' tests/CMakeLists.txt)}"
for t in $targets; do cmake --build "$build" -j "$jobs" --target "fuzz_$t"; done
export ARMADA_MODEL_DIR="$models"
# llama.cpp itself is not instrumented; its leaks at exit are not ours to report.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
summary=()
for t in $targets; do
  mkdir -p "$build/corpus/$t" "$build/findings/$t"
  echo "== fuzz_$t for ${seconds}s"
  set +e
  "$build/tests/fuzz_$t" "$build/corpus/$t" "tests/fuzz/$t" -max_total_time="$seconds" -max_len=65536 \
    -rss_limit_mb=4096 -artifact_prefix="$build/findings/$t/" -print_final_stats=1 2>"$build/fuzz_$t.log"
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz_$t.log" | tail -1 | grep -o '[0-9]*$' || echo 0)
  found=$(find "$build/findings/$t" -type f | wc -l)
  summary+=("$t: $runs inputs, exit $rc, $found finding(s)")
  [ "$found" -eq 0 ] || find "$build/findings/$t" -type f
done
printf '%s\n' "${summary[@]}"

#!/usr/bin/env bash
# clang-format check on every source file, then clang-tidy over the project's own sources
# (two files at a time; warnings are errors, see .clang-tidy).
set -euo pipefail
build="${1:-build}"
files=$(git ls-files 'src/*.cpp' 'src/*.h' 'tests/*.cpp')
clang-format --dry-run --Werror $files
git ls-files 'src/*.cpp' | xargs -P "${LINT_JOBS:-2}" -n 1 clang-tidy -p "$build" --quiet 2>/dev/null
echo "lint: clean"

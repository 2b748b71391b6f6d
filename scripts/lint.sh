#!/usr/bin/env bash
# clang-format check on every source file, then clang-tidy over the project's own sources.
set -euo pipefail
build="${1:-build}"
files=$(git ls-files 'src/*.cpp' 'src/*.h' 'tests/*.cpp')
clang-format --dry-run --Werror $files
clang-tidy -p "$build" --quiet $(git ls-files 'src/*.cpp') 2>/dev/null
echo "lint: clean"

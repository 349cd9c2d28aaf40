#!/usr/bin/env bash
# Applies clang-format (Google base, 100 columns; .clang-format) to the C++ and CUDA sources.
# With --check, changes nothing and fails if a file would change.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [ "${1:-}" = --check ]; then
  clang-format --dry-run --Werror $files
else
  clang-format -i $files
fi

#!/usr/bin/env bash
# Applies clang-format (Google base, 100 columns; .clang-format) to the C++ and CUDA sources.
# Usage: tools/format.sh [--check]   (--check changes nothing and fails if a file would change)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "" | --check) ;;
  *) echo "usage: tools/format.sh [--check]" >&2; exit 2 ;;
esac
files=$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [ "${1:-}" = --check ]; then
  clang-format --dry-run --Werror $files
else
  clang-format -i $files
fi

#!/usr/bin/env bash
# Applies clang-format (Google base, 100 columns; .clang-format) to the C++ and CUDA sources, and
# ruff (pyproject.toml: format, then the lint rules) to the Python.
# Usage: tools/format.sh [--check]   (--check changes nothing and fails if a file would change or a
# lint rule fails; CI runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "" | --check) ;;
  *) echo "usage: tools/format.sh [--check]" >&2; exit 2 ;;
esac
files=$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
python_files=$(git ls-files '*.py')
ruff=ruff
[ -x .venv/bin/ruff ] && ruff=.venv/bin/ruff
if [ "${1:-}" = --check ]; then
  clang-format --dry-run --Werror $files
  "$ruff" format --check $python_files
  "$ruff" check $python_files
else
  clang-format -i $files
  "$ruff" format $python_files
  "$ruff" check --fix $python_files
fi

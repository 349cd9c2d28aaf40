#!/usr/bin/env bash
# Configures and builds sfmoe into build/ (used by run.sh and test.sh). The CUDA backend is built
# whenever nvcc is found; the Python extension whenever the project's .venv (or python3) has
# nanobind.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
python=python3
[ -x .venv/bin/python ] && python=$PWD/.venv/bin/python
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DPython_EXECUTABLE="$python" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j "$(nproc)"

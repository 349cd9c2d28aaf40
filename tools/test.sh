#!/usr/bin/env bash
# Install what is needed, build, and run every test: the C++ suites through CTest (the GPU suite
# skips, and says so, where no GPU is usable) and the Python suite through pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
ctest --test-dir build --output-on-failure --no-tests=error
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
PYTHONPATH=build/python "$python" -m pytest -q -rs tests/python

#!/usr/bin/env bash
# The main job: install what is needed, build (incrementally, through ccache when present), and
# train the demo MoE language model (tools/train_demo.py, docs/demo.md): a progress bar per
# recipe, then the loss-curve plot and a table in demo-out/. Arguments go to the demo
# (--steps N, --out DIR, --device cpu|cuda). build/sfmoe prints the build, the backends and the
# numerics self-check.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" exec "$python" tools/train_demo.py "$@"

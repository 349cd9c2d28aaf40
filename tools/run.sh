#!/usr/bin/env bash
# The main job: install what is needed, build, and run the `sfmoe` program (build, backends,
# detected GPU, numerics self-check on every available backend).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
exec build/sfmoe "$@"

#!/usr/bin/env bash
# Installs what building and testing sfmoe needs, into the checkout (.deps/, .venv/), pinned.
# Safe to re-run: finished steps are skipped. Without network access (the GPU machine) a failed
# download is reported and skipped: the build then uses what the machine already has (system
# Python packages; no CUTLASS headers means the CuTe-based code is left out, with a warning).
set -euo pipefail
cd "$(dirname "$0")/.."

CUTLASS_VERSION=4.2.0.0
# torch (about 3 GB with its CUDA libraries, kept in .venv): the torch module's tests and the demo
# run on the CPU backend in CI; tqdm and matplotlib: the demo's progress bar and loss plot;
# safetensors: checkpoints in the torch module; jax and jaxlib (CPU): the JAX block's FFI handlers
# are built against jaxlib's headers and tested on JAX's CPU backend (0.10.2 is the newest release
# this machine's index has; the GPU machine runs JAX 0.11 against its own headers); flax and optax:
# the JAX block's Flax module and the optimizer-state migrations.
PY_PACKAGES=(nanobind==3.1.0 numpy==2.4.6 ml_dtypes==0.6.0 pytest==9.2.0 ruff==0.17.6 torch==2.15.0
             tqdm==4.70.1 matplotlib==3.11.2 safetensors==0.8.0 jax==0.10.2 jaxlib==0.10.2
             flax==0.12.8 optax==0.2.8)

have_network() { [ "${SFMOE_OFFLINE:-0}" != 1 ]; }
PIP_OPTS=(-q --disable-pip-version-check --root-user-action=ignore --retries 1 --timeout 20)

# System tools: cmake, a C++ compiler, GoogleTest, ccache (which CMake picks up: fast rebuilds).
# Installed from Debian's packages when missing.
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
command -v ccache >/dev/null || missing+=(ccache)
command -v clang++ >/dev/null || missing+=(clang)  # (tools/fuzz.sh: libFuzzer)
if [ ${#missing[@]} -gt 0 ] && have_network && command -v apt-get >/dev/null; then
  echo "install_deps: apt-get install ${missing[*]}"
  { timeout 300 apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${missing[@]}"; } ||
    echo "install_deps: could not install ${missing[*]} (offline?); continuing without them"
fi

# CUTLASS / CuTe headers from the PyPI wheel (headers only; --no-deps keeps its Python side out).
if [ ! -f .deps/cutlass/cutlass_library/source/include/cute/layout.hpp ]; then
  if have_network; then
    echo "install_deps: nvidia-cutlass==$CUTLASS_VERSION headers -> .deps/cutlass"
    python3 -m pip install "${PIP_OPTS[@]}" --no-deps --target .deps/cutlass \
      "nvidia-cutlass==$CUTLASS_VERSION" ||
      { echo "install_deps: could not fetch nvidia-cutlass (offline?); building without CuTe code"; rm -rf .deps/cutlass; }
  fi
fi

# Python tools for the extension and its tests, in a project-local virtual environment. A venv made
# before a package joined the list gets the list again (the marker names the list it holds).
if [ ! -f .venv/.sfmoe-ready ] || [ "$(cat .venv/.sfmoe-ready)" != "${PY_PACKAGES[*]}" ]; then
  if have_network; then
    echo "install_deps: Python packages -> .venv (${PY_PACKAGES[*]})"
    if python3 -m venv .venv && .venv/bin/python -m pip install "${PIP_OPTS[@]}" "${PY_PACKAGES[@]}"; then
      echo "${PY_PACKAGES[*]}" > .venv/.sfmoe-ready
    else
      echo "install_deps: could not set up .venv (offline?); using the system python3 as it is"
      rm -rf .venv
    fi
  fi
fi

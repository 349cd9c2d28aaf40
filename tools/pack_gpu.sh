#!/usr/bin/env bash
# Packs the binaries the GPU machine runs (docs/gpu.md) into build-carry.tar.xz at the checkout's
# root (git-ignored): libsfmoe.so, the sfmoe CLI, the GPU test suite and the C++ benchmarks from
# build/ (or $SFMOE_BUILD). The test binary links the library statically, so the two together pass
# 64 MiB unpacked; packed they are about a sixth of that. tools/gpu_check.sh unpacks the archive
# into build-carry/ when that folder is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${SFMOE_BUILD:-build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/bench"
cp "$BUILD/libsfmoe.so" "$BUILD/sfmoe" "$stage/"
cp "$BUILD/tests/sfmoe_gpu_tests" "$stage/tests/"
cp "$BUILD"/bench/sfmoe_bench_* "$stage/bench/"
tar -C "$stage" -cf - . | xz -T0 -6 > build-carry.tar.xz
echo "build-carry.tar.xz: $(du -h build-carry.tar.xz | cut -f1) (carry it; gpu_check.sh unpacks it)"

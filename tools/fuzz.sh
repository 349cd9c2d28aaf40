#!/usr/bin/env bash
# The libFuzzer target over the C API (tests/fuzz/fuzz_api.cpp) under AddressSanitizer and
# UndefinedBehaviorSanitizer: a clang build of the CPU library in build-fuzz/, then a bounded run
# (SFMOE_FUZZ_SECONDS, 90 by default) from the checked-in corpus (tests/fuzz/corpus, read only: new
# inputs go to build-fuzz/corpus). Any crash, leak, guard-byte overwrite or sanitizer report fails
# it (libFuzzer writes the input as build-fuzz/crash-*). CI runs it.
# Usage: tools/fuzz.sh [--merge]   (--merge: fold the run's new inputs into tests/fuzz/corpus)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${SFMOE_FUZZ_SECONDS:-90}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f build-fuzz/CMakeCache.txt ]; then
  mkdir -p build-fuzz
  CC=clang CXX=clang++ cmake -S . -B build-fuzz "${generator[@]}" -DSFMOE_CUDA=OFF -DSFMOE_PYTHON=OFF \
    -DSFMOE_BUILD_TESTS=OFF -DSFMOE_BUILD_BENCH=OFF -DSFMOE_BUILD_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all" \
    > build-fuzz/configure.log 2>&1 || { cat build-fuzz/configure.log; exit 1; }
fi
cmake --build build-fuzz -j "$(nproc)" --target sfmoe_fuzz
mkdir -p build-fuzz/corpus
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
start=$(date +%s)
(cd build-fuzz && ./sfmoe_fuzz -max_total_time="$seconds" -max_len=4096 -timeout=20 -rss_limit_mb=2048 \
  -print_final_stats=1 corpus ../tests/fuzz/corpus)
echo "fuzz: $(( $(date +%s) - start )) s, no crash"
if [ "${1:-}" = --merge ]; then
  build-fuzz/sfmoe_fuzz -merge=1 tests/fuzz/corpus build-fuzz/corpus
fi

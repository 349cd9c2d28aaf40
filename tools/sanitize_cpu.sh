#!/usr/bin/env bash
# The CPU backend's suites under AddressSanitizer and UndefinedBehaviorSanitizer (README.md):
# a second build in build-asan/ without the CUDA backend (the C++ library, its C++ tests and the
# Python extension), then the C++ suite and the Python suite over it. Any sanitizer report fails
# the run (halt_on_error; UBSan does not recover). CI runs it after the regular tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
[ -x .venv/bin/python ] && python=$PWD/.venv/bin/python
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
if [ ! -f build-asan/CMakeCache.txt ]; then
  cmake -S . -B build-asan "${generator[@]}" -DSFMOE_CUDA=OFF -DSFMOE_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE="$python" \
    -DCMAKE_CXX_FLAGS="$sanitizers" -DCMAKE_C_FLAGS="$sanitizers" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined"
fi
start=$(date +%s)
cmake --build build-asan -j "$(nproc)"
echo "sanitize_cpu: build $(( $(date +%s) - start )) s"
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
start=$(date +%s)
build-asan/tests/sfmoe_tests --gtest_brief=1
echo "sanitize_cpu: C++ suite $(( $(date +%s) - start )) s"
# Python loads the sanitized extension: the runtimes preloaded; CPython and torch keep memory
# until exit, so leak checking is off here (the C++ suite above checks leaks). pytest captures at
# the sys level only, so that a sanitizer's report (written to fd 2) reaches the log.
start=$(date +%s)
LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=0 \
  PYTHONPATH=build-asan/python "$python" -m pytest -q -p no:cacheprovider --capture=sys tests/python
echo "sanitize_cpu: Python suite $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# Runs on the GPU machine. Uses the binaries in build/ when they were prebuilt (on a CPU machine)
# and run here, builds whatever is missing, then: the CLI self-check, every test suite (C++ CPU
# and GPU suites, the GPU suite again under compute-sanitizer memcheck and racecheck, the Python
# tests with torch), the benchmarks; prints a short table last.
# Environment: OUT (where logs and JSON go; default /tmp/sfmoe-gpu-check), SFMOE_SANITIZE=0 to
# skip the sanitizer passes, SFMOE_SKIP_PYTHON=1 to skip the Python extension, SFMOE_NCU=1 to add
# Nsight Compute's sections on one wgrad call (bench/probe_wgrad_ncu.py). The grouped-GEMM
# benchmark runs without its tile sweeps (SFMOE_BENCH_GEMM=quick) unless SFMOE_BENCH_GEMM is set
# (e.g. to "all"): the sweeps are for tuning heuristics/gemm_tiles.h and take minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/sfmoe-gpu-check}
mkdir -p "$OUT"
declare -A RESULT
status_line() { RESULT[$1]="$2"; echo "== $1: $2"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true

# ---- binaries: prebuilt when present and runnable, otherwise built here ---------------------------
# (tools/pack_gpu.sh's archive is unpacked into build-carry/ when that folder is absent.)
if [ -f build-carry.tar.xz ] && [ ! -d build-carry ]; then
  mkdir -p build-carry && tar -C build-carry -xJf build-carry.tar.xz
fi
BUILD=${SFMOE_BUILD:-build}
# (The CPU suite is optional here: it runs on the CPU machines, and carrying it as well can exceed
# what travels to this machine.)
needed=("$BUILD/sfmoe" "$BUILD/tests/sfmoe_gpu_tests" "$BUILD/bench/sfmoe_bench_memory"
        "$BUILD/bench/sfmoe_bench_quantize" "$BUILD/bench/sfmoe_bench_ep")
prebuilt=1
for b in "${needed[@]}"; do
  if [ ! -x "$b" ] || ldd "$b" 2>/dev/null | grep -q "not found"; then prebuilt=0; fi
done
if [ $prebuilt = 1 ]; then
  status_line build "prebuilt binaries from $BUILD/"
else
  echo "== building in build-gpu/ (some prebuilt binaries are missing or do not load)"
  BUILD=build-gpu
  cmake -S . -B "$BUILD" -G Ninja -DSFMOE_CUDA=ON -DSFMOE_PYTHON=OFF > "$OUT/cmake.log" 2>&1 &&
    ninja -C "$BUILD" > "$OUT/build.log" 2>&1
  status_line build "built here in $BUILD/ (rc $?)"
fi

run_gtest() {  # name binary [args...]
  local name=$1; shift
  "$@" --gtest_output=json:"$OUT/$name.json" > "$OUT/$name.log" 2>&1
  local rc=$?
  local summary
  summary=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/$name.log" | tr '\n' ' ')
  status_line "$name" "rc $rc; $summary"
  grep -E "^\[ (numerics|device numerics|hardware cvt|cast|graph|validation|gpu|quantize|quantize graph|router|permute|activation|gemm|gemm graph) \]" "$OUT/$name.log" | sed 's/^/   /'
  return $rc
}

# ---- the CLI self-check --------------------------------------------------------------------------
"$BUILD/sfmoe" > "$OUT/selfcheck.log" 2>&1
status_line selfcheck "rc $? ($(tail -1 "$OUT/selfcheck.log"))"
cat "$OUT/selfcheck.log"

# ---- tests ----------------------------------------------------------------------------------------
if [ -x "$BUILD/tests/sfmoe_tests" ]; then
  run_gtest cpu_tests "$BUILD/tests/sfmoe_tests"
else
  status_line cpu_tests "not carried (runs on the CPU machines)"
fi
run_gtest gpu_tests "$BUILD/tests/sfmoe_gpu_tests"
if [ "${SFMOE_SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    # The large-tensor case is left out here: it adds minutes under the sanitizers, no coverage.
    # The NCCL tests run in a pass of their own with --report-api-errors no (as in
    # tools/sanitize.sh): NCCL's initialization probes kernels it has no image for.
    compute-sanitizer --tool $tool --error-exitcode 3 --print-limit 20 \
      "$BUILD/tests/sfmoe_gpu_tests" \
      --gtest_filter=-CudaQuantize.LargeTensorAcrossSixtyFourGroups:CudaEpNccl.* \
      > "$OUT/sanitizer_$tool.log" 2>&1 &&
      compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 3 --print-limit 20 \
        "$BUILD/tests/sfmoe_gpu_tests" --gtest_filter='CudaEpNccl.*' >> "$OUT/sanitizer_$tool.log" 2>&1
    rc=$?
    status_line "sanitizer_$tool" "rc $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
  done
fi

# ---- C++ benchmarks (before the Python ones, which take longer) ---------------------------------
SFMOE_BENCH_JSON="$OUT/bench_memory.json" "$BUILD/bench/sfmoe_bench_memory" > "$OUT/bench_memory.log" 2>&1
status_line bench_memory "rc $?"
SFMOE_BENCH_JSON="$OUT/bench_quantize.json" "$BUILD/bench/sfmoe_bench_quantize" > "$OUT/bench_quantize.log" 2>&1
status_line bench_quantize "rc $?"
SFMOE_BENCH_JSON="$OUT/bench_ep.json" "$BUILD/bench/sfmoe_bench_ep" > "$OUT/bench_ep.log" 2>&1
status_line bench_ep "rc $?"

# ---- Python extension (built here: the GPU machine's Python differs from the CPU machines') ------
if [ "${SFMOE_SKIP_PYTHON:-0}" != 1 ]; then
  if cmake -S python -B build-py -G Ninja -DPython_EXECUTABLE="$(command -v python3)" \
       -DSFMOE_LIBRARY="$ROOT/$BUILD/libsfmoe.so" > "$OUT/python_build.log" 2>&1 &&
     ninja -C build-py >> "$OUT/python_build.log" 2>&1; then
    PYTHONPATH="$ROOT/build-py/python" python3 -m pytest -q -rs tests/python > "$OUT/pytest.log" 2>&1
    status_line pytest "rc $?; $(tail -1 "$OUT/pytest.log")"
    PYTHONPATH="$ROOT/build-py/python" OUT="$OUT" python3 bench/bench_cast_torch.py > "$OUT/bench_cast_torch.log" 2>&1
    status_line bench_cast_torch "rc $?"
    PYTHONPATH="$ROOT/build-py/python" OUT="$OUT" python3 bench/bench_quantize_torch.py > "$OUT/bench_quantize_torch.log" 2>&1
    status_line bench_quantize_torch "rc $?"
    PYTHONPATH="$ROOT/build-py/python:$ROOT/bench" OUT="$OUT" python3 bench/bench_moe_ops_torch.py > "$OUT/bench_moe_ops_torch.log" 2>&1
    status_line bench_moe_ops_torch "rc $?"
    SFMOE_BENCH_GEMM=${SFMOE_BENCH_GEMM:-quick} PYTHONPATH="$ROOT/build-py/python:$ROOT/bench" OUT="$OUT" \
      python3 bench/bench_grouped_gemm_torch.py > "$OUT/bench_grouped_gemm_torch.log" 2>&1
    status_line bench_grouped_gemm_torch "rc $?"
    SFMOE_BENCH_ROUTER_GEMM=fp32 PYTHONPATH="$ROOT/build-py/python:$ROOT/bench" OUT="$OUT" python3 bench/bench_moe_layer_torch.py \
      > "$OUT/bench_moe_layer_torch.log" 2>&1
    status_line bench_moe_layer_torch "rc $?"
    # Nsight Compute on one wgrad call, sfmoe's and dense cuBLAS's (SFMOE_NCU=1; stall reasons and
    # pipe use into ncu_wgrad_*.txt, sfmoe's stalls per instruction into ncu_wgrad_own_sass.txt):
    # what bench/probe_wgrad_ncu.py describes.
    ncu=$(command -v ncu || true)
    if [ "${SFMOE_NCU:-0}" = 1 ] && [ -n "$ncu" ]; then
      sections=(--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy
        --print-details all)
      SFMOE_GEMM_TILE=wgrad256 PYTHONPATH="$ROOT/build-py/python:$ROOT/bench" "$ncu" "${sections[@]}" \
        -k regex:wgrad_grouped_gemm_kernel --launch-skip 2 --launch-count 1 python3 bench/probe_wgrad_ncu.py \
        > "$OUT/ncu_wgrad_own.txt" 2>&1
      status_line ncu_wgrad "own rc $?"
      # (where the warps wait: the stall samples per SASS instruction)
      SFMOE_GEMM_TILE=wgrad256 PYTHONPATH="$ROOT/build-py/python:$ROOT/bench" bench/profile_sass.sh \
        wgrad_grouped_gemm_kernel 2 20 -- python3 bench/probe_wgrad_ncu.py > "$OUT/ncu_wgrad_own_sass.txt" 2>&1
      # cuBLAS's kernel names start so (nvjet_sm90_... on Hopper); sfmoe's setup kernels do not.
      PYTHONPATH="$ROOT/build-py/python:$ROOT/bench" "$ncu" "${sections[@]}" \
        -k regex:'^(nvjet|sm90|sm80|ampere)' --launch-skip 2 --launch-count 1 \
        python3 bench/probe_wgrad_ncu.py > "$OUT/ncu_wgrad_dense.txt" 2>&1
      status_line ncu_wgrad "${RESULT[ncu_wgrad]}, dense rc $?"
    fi
  else
    status_line pytest "extension build failed (see python_build.log)"
    tail -20 "$OUT/python_build.log"
  fi
fi

summary() {
  echo
  echo "================================ sfmoe GPU check ================================"
  for k in build selfcheck cpu_tests gpu_tests sanitizer_memcheck sanitizer_racecheck bench_memory bench_quantize pytest bench_cast_torch bench_quantize_torch bench_moe_ops_torch bench_grouped_gemm_torch bench_moe_layer_torch ncu_wgrad; do
    if [ -n "${RESULT[$k]:-}" ]; then printf "%-20s %s\n" "$k" "${RESULT[$k]}"; fi
  done
}
summary
echo
tail -8 "$OUT/bench_memory.log"
[ -f "$OUT/bench_cast_torch.log" ] && { echo; tail -4 "$OUT/bench_cast_torch.log"; }
[ -f "$OUT/bench_quantize_torch.log" ] && { echo; tail -15 "$OUT/bench_quantize_torch.log"; }
[ -f "$OUT/bench_quantize.log" ] && { echo; tail -14 "$OUT/bench_quantize.log"; }
[ -f "$OUT/bench_moe_ops_torch.log" ] && { echo; tail -14 "$OUT/bench_moe_ops_torch.log"; }
[ -f "$OUT/bench_grouped_gemm_torch.log" ] && { echo; cat "$OUT/bench_grouped_gemm_torch.log"; }
[ -f "$OUT/bench_moe_layer_torch.log" ] && { echo; cat "$OUT/bench_moe_layer_torch.log"; }
# (the pass/fail lines again, last: the benchmark tables above push them out of a short tail)
summary

#!/usr/bin/env bash
# Compiles sfmoe's own GEMM kernels again with ptxas's report (-Xptxas=-v) and fails on a note that
# ptxas serialized a kernel's wgmma instructions (C7514 / C7515 "Potential Performance Loss"): the
# MMAs then wait for each other, a large silent slowdown that no test sees. The commands come from
# the build's compile_commands.json (tools/build.sh first; $SFMOE_BUILD, default build/); the
# objects go to a temporary folder, the build is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${SFMOE_BUILD:-build}
SOURCES=(src/cuda/gemm/sm90_wgrad_grouped_gemm.cu src/cuda/gemm/sm90_contiguous_grouped_gemm.cu
         src/cuda/gemm/sm90_contiguous_blockwise_gemm.cu)
if ! grep -q "^CMAKE_CUDA_COMPILER:" "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "check_ptxas: skipped ($BUILD compiles no CUDA kernels)"
  exit 0
fi
[ -f "$BUILD/compile_commands.json" ] ||
  { echo "check_ptxas: $BUILD/compile_commands.json missing (configure $BUILD again)"; exit 2; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for src in "${SOURCES[@]}"; do
  # The source's command with its object sent to the scratch folder, no dependency file, and ccache
  # bypassed (its cached output would be the normal build's, without the report).
  command=$(python3 - "$BUILD/compile_commands.json" "$PWD/$src" "$scratch/kernel.o" <<'PY'
import json, shlex, sys
entries, source, obj = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
entry = next((e for e in entries if e["file"] == source), None)
if entry is None:
    sys.exit(f"check_ptxas: no compile command for {source}")
args = shlex.split(entry["command"])
if args[0].endswith("ccache"):
    args = args[1:]
out, skip = [], 0
for a in args:
    if skip:
        skip -= 1
        continue
    if a == "-MD":
        continue
    if a in ("-MT", "-MF"):
        skip = 1
        continue
    if a == "-o":
        out += ["-o", obj]
        skip = 1
        continue
    out.append(a)
print("cd " + shlex.quote(entry["directory"]) + " && " + shlex.join(out + ["-Xptxas=-v"]))
PY
)
  log="$scratch/$(basename "$src").log"
  (eval "$command") > "$log" 2>&1 || { cat "$log"; exit 1; }
  serialized=$(grep -c "C751[45]" "$log" || true)
  kernels=$(grep -c "Compiling entry function" "$log" || true)
  echo "check_ptxas: $src: $kernels kernels, $serialized with serialized wgmma"
  if [ "$serialized" != 0 ]; then
    grep "C751[45]" "$log" | cut -c1-300
    status=1
  fi
done
exit $status

#!/usr/bin/env bash
# Compiles sfmoe's own GEMM kernels again with ptxas's report (-Xptxas=-v) and fails on a note that
# ptxas serialized a kernel's wgmma instructions (C7514 / C7515 "Potential Performance Loss"): the
# MMAs then wait for each other, a large silent slowdown that no test sees. The commands come from
# the build (tools/build.sh first; $SFMOE_BUILD, default build/); the objects go to a temporary
# folder, the build is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${SFMOE_BUILD:-build}
SOURCES=(src/cuda/gemm/sm90_wgrad_grouped_gemm.cu src/cuda/gemm/sm90_contiguous_grouped_gemm.cu)
if ! grep -q "^CMAKE_CUDA_COMPILER:" "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "check_ptxas: skipped ($BUILD compiles no CUDA kernels)"
  exit 0
fi
command -v ninja > /dev/null && [ -f "$BUILD/build.ninja" ] ||
  { echo "check_ptxas: needs $BUILD configured for Ninja (tools/build.sh uses it when installed)"; exit 2; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for src in "${SOURCES[@]}"; do
  object="CMakeFiles/sfmoe_objects.dir/$src.o"
  command=$(ninja -C "$BUILD" -t commands "$object" | tail -1)
  [ -n "$command" ] || { echo "check_ptxas: no compile command for $src in $BUILD"; exit 2; }
  # The object and its dependency file into the scratch folder, ccache bypassed (its cached
  # output would be the normal build's, without the report).
  command=${command//" -o $object"/" -o $scratch/kernel.o"}
  command=$(sed -E "s# -MD -MT [^ ]+ -MF [^ ]+##; s#^[^ ]*ccache ##" <<< "$command")
  log="$scratch/$(basename "$src").log"
  (cd "$BUILD" && eval "$command -Xptxas=-v") > "$log" 2>&1 || { cat "$log"; exit 1; }
  serialized=$(grep -c "C751[45]" "$log" || true)
  kernels=$(grep -c "Compiling entry function" "$log" || true)
  echo "check_ptxas: $src: $kernels kernels, $serialized with serialized wgmma"
  if [ "$serialized" != 0 ]; then
    grep "C751[45]" "$log" | cut -c1-300
    status=1
  fi
done
exit $status

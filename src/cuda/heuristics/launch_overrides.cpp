#include "src/cuda/heuristics/launch_overrides.h"

#include <stdlib.h>

namespace sfmoe {
namespace cuda {
namespace {

LaunchOverrides from_environment() {
  LaunchOverrides o;
  o.gemm_tile = gemm_tile_named(getenv("SFMOE_GEMM_TILE"));
  // (at most 1 GiB: a unit's prefetch then stays below the instruction's 32-bit size)
  if (const char* mib = getenv("SFMOE_WGRAD_PREFETCH_MIB")) {
    char* end = nullptr;
    const long long value = strtoll(mib, &end, 10);
    if (end != mib && *end == '\0' && value >= 0 && value <= 1024) o.wgrad_prefetch_mib = value;
  }
  return o;
}

// Initialized when the library is loaded (static initialization of this object file).
LaunchOverrides loaded = from_environment();

}  // namespace

const LaunchOverrides& launch_overrides() { return loaded; }

LaunchOverrides& launch_overrides_for_tests() { return loaded; }

}  // namespace cuda
}  // namespace sfmoe

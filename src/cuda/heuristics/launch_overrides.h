// The launch choices that something other than the heuristics may make. They are read once, when
// the library is loaded, never per call: a call's launches depend on its arguments alone (a
// captured graph replays what the call chose), and getenv is not free on a hot path.
//
// - SFMOE_GEMM_TILE=coop128|coop256|pingpong64|coop256x128|pingpong128|contig256|contig192|
//   contig128|contig256c2|contig192c2 (docs/grouped_gemm.md): every grouped GEMM runs that tile
//   configuration instead of the heuristic's (tile studies); an unknown value is ignored, a tile
//   the recipe is not compiled for falls back to its default (an own-kernel tile, on a call that
//   kernel does not take, to the heuristic's choice).
// - SFMOE_WGRAD_PREFETCH_MIB=<n>: sfmoe's BF16 wgrad kernel prefetches into L2 the groups whose
//   dY_g and X_g together take at most n MiB (0: none; at most 1024) instead of its default bound
//   (0 until the prefetch is measured; studies).
//
// The test suites (linked statically) force the paths they cover through
// launch_overrides_for_tests(); nothing else changes them after load.
#pragma once

#include <stdint.h>

#include <optional>

#include "src/cuda/heuristics/gemm_tiles.h"

namespace sfmoe {
namespace cuda {

struct LaunchOverrides {
  std::optional<GemmTile> gemm_tile;          // SFMOE_GEMM_TILE
  std::optional<int64_t> wgrad_prefetch_mib;  // SFMOE_WGRAD_PREFETCH_MIB
  // Tests only: the rows each warp of the amax row stream walks (0: the grid's share), so that
  // runs cross group boundaries.
  int64_t amax_rows_per_warp = 0;
};

const LaunchOverrides& launch_overrides();

// Tests only, between calls (not synchronized with calls running on other threads).
LaunchOverrides& launch_overrides_for_tests();

}  // namespace cuda
}  // namespace sfmoe

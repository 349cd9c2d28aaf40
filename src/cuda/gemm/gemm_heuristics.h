// Which compiled tile configuration a grouped GEMM call runs (docs/grouped_gemm.md). The host
// knows the bounds only (row capacity, group count, n, k), so the choice is per shape family.
// Measured on the H200 (docs/KERNEL_NOTES.md, grouped GEMM v1): the 128 x 256 tile with a 2-CTA
// cluster sharing B's loads was the fastest of the three on all 12 forward cases (DeepSeek-V3,
// Qwen3 -- 512 rows per expert -- and Mixtral; balanced and Zipf), by 3-10% over 128 x 128 and
// 20-60% over 64 x 128. The 64 x 128 ping-pong tile is kept for groups so small that a 128-row
// tile would be mostly empty (fewer than 128 rows per group on average; decode-sized batches).
// FP8 operands (K 128 per step, a second FP32 accumulator for the periodic promotion) run the
// 128 x 128 tile: it was the fastest of the three on all 12 cases, 1.1-2.2x the 128 x 256 one,
// whose two accumulators of 128 registers each leave it starved.
// SFMOE_GEMM_TILE=coop128|coop256|pingpong64 overrides the choice (benchmark sweeps).
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace sfmoe {
namespace cuda {

enum class GemmTile {
  kCooperative128x128,  // 128 x 128 (K 64 BF16 / 128 FP8), cluster 1
  kCooperative128x256,  // 128 x 256, cluster 2 x 1 along M: the default
  kPingpong64x128,      // 64 x 128, two consumer warp groups alternating: small groups
};

inline GemmTile choose_gemm_tile(bool fp8, int64_t gemm_m_bound_per_group, int64_t /*gemm_n*/,
                                 int64_t /*gemm_k*/) {
  if (const char* forced = getenv("SFMOE_GEMM_TILE")) {
    if (strcmp(forced, "coop128") == 0) return GemmTile::kCooperative128x128;
    if (strcmp(forced, "coop256") == 0) return GemmTile::kCooperative128x256;
    if (strcmp(forced, "pingpong64") == 0) return GemmTile::kPingpong64x128;
  }
  if (gemm_m_bound_per_group < 128) return GemmTile::kPingpong64x128;
  return fp8 ? GemmTile::kCooperative128x128 : GemmTile::kCooperative128x256;
}

}  // namespace cuda
}  // namespace sfmoe

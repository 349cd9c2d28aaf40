// Which compiled tile configuration a grouped GEMM call runs (docs/grouped_gemm.md). The host
// knows the bounds only (row capacity, group count, n, k), so the choice is per shape family:
// small groups (many experts, few rows each: Qwen3-like) want small M tiles that waste less on
// each group's last tile; wide outputs with many rows per group (Mixtral, DeepSeek-V3 fc1) want
// the wide tile and a 2-CTA cluster that shares the B tile's loads.
// SFMOE_GEMM_TILE=coop128|coop256|pingpong64 overrides the choice (benchmark sweeps).
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace sfmoe {
namespace cuda {

enum class GemmTile {
  kCooperative128x128,  // 128 x 128 (K 64 BF16 / 128 FP8), cluster 1: the default
  kCooperative128x256,  // 128 x 256, cluster 2 x 1 along M: wide N, many rows per group
  kPingpong64x128,      // 64 x 128, two consumer warp groups alternating: small groups
};

inline GemmTile choose_gemm_tile(int64_t gemm_m_bound_per_group, int64_t gemm_n,
                                 int64_t /*gemm_k*/) {
  if (const char* forced = getenv("SFMOE_GEMM_TILE")) {
    if (strcmp(forced, "coop128") == 0) return GemmTile::kCooperative128x128;
    if (strcmp(forced, "coop256") == 0) return GemmTile::kCooperative128x256;
    if (strcmp(forced, "pingpong64") == 0) return GemmTile::kPingpong64x128;
  }
  if (gemm_m_bound_per_group < 256) return GemmTile::kPingpong64x128;
  if (gemm_n >= 4096 && gemm_m_bound_per_group >= 1024) return GemmTile::kCooperative128x256;
  return GemmTile::kCooperative128x128;
}

}  // namespace cuda
}  // namespace sfmoe

// Which compiled tile configuration a grouped GEMM call runs (docs/grouped_gemm.md). The host
// knows the bounds only (row capacity, group count, n, k), so the choice is per recipe and shape
// family. Measured on the H200 (docs/KERNEL_NOTES.md, grouped GEMM):
// - BF16: the 128 x 256 tile with a 2-CTA cluster sharing B's loads was the fastest of the three
//   on all 12 forward cases (DeepSeek-V3, Qwen3 -- 512 rows per expert -- and Mixtral; balanced
//   and Zipf), by 3-10% over 128 x 128 and 20-60% over 64 x 128.
// - FP8 with the periodic FP32 promotion (the accurate accumulation): 128 x 128, 1.1-2.2x the
//   128 x 256 tile, whose two accumulators of 128 registers each leave it starved.
// - FP8 with fast accumulation (one accumulator): by the GEMM's K and N. 128 x 128 ping-pong in
//   2-CTA clusters (the epilogue of one consumer overlaps the other's mainloop) when K <= 4096 and
//   N >= 2048: DeepSeek-V3 fc2 (K 2048) +2-4%, Qwen3 fc2 (K 768) +2-10%, Mixtral fc1 (K 4096)
//   -1..+3% over 128 x 256. 128 x 256 in 2-CTA clusters otherwise: longer K (Mixtral fc2, K
//   14336: +4-8%; DeepSeek-V3 fc1 on Zipf groups, K 7168: +14%) and Qwen3 fc1 (N 1536: +1-4% in
//   each of four same-process comparisons). 2026-11-30.
// - FP8 blockwise: 128 x 128 cooperative (the only one compiled; ping-pong 128 x 128 in 2-CTA
//   clusters measured 0.31-0.54x of it: its consumers spill, KERNEL_NOTES.md).
// - BF16 wgrad (M = n, N = k, K = the group's rows): 128 x 128 ping-pong in 2-CTA clusters when
//   K <= 1024 and N >= 4096 (DeepSeek-V3 fc1, K 1024, N 7168: 639 / 642 / 644 TFLOP/s against 594 /
//   589 / 598 for 128 x 256 in three full GPU checks; a short reduction leaves the epilogue a large
//   share, which ping-pong overlaps with the other consumer's mainloop); 128 x 256 otherwise
//   (Qwen3, K 512, N 2048: 462-466 against 471-486; Mixtral, K 2048, N 4096: 507-528 against
//   584-595).
// The 64 x 128 ping-pong tile is kept for groups so small that a 128-row tile would be mostly
// empty (fewer than 128 rows per group on average; decode-sized batches).
// Measured and dropped: 128 x 128 cooperative in 2-CTA clusters for FP8 fast accumulation (behind
// 128 x 256; the ping-pong 128 x 128 below is another kernel) and blockwise (+1-5% on balanced
// groups, -1 to -6% on Zipf ones), 256 x 128 in 2-CTA clusters along N for BF16 (within 1% of 128 x
// 256). Also compiled for BF16 and FP8 fast accumulation, from CUTLASS's grouped-GEMM example: 256
// x 128 cooperative in 2 x 2 clusters (behind 128 x 256 on every case of both recipes) and 128 x
// 128 ping-pong in 2 x 1 (chosen above for FP8 fast accumulation; for BF16 within 2% of 128 x 256
// on 6 of the 12 cases and up to 24% behind on the others).
// The choice is a pure function of the host's bounds; SFMOE_GEMM_TILE (read once at load,
// launch_overrides.h) replaces it in sm90_grouped_gemm.cu, and a tile the recipe is not compiled
// for falls back to the recipe's default there.
#pragma once

#include <stdint.h>
#include <string.h>

#include <optional>

#include "src/common/grouped_gemm_args.h"

namespace sfmoe {
namespace cuda {

enum class GemmTile {
  kCooperative128x128,  // 128 x 128 (K 64 BF16 / 128 FP8), cluster 1
  kCooperative128x256,  // 128 x 256, cluster 2 x 1 along M
  kPingpong64x128,      // 64 x 128, two consumer warp groups alternating: small groups
  kCooperative256x128,  // 256 x 128, cluster 2 x 2 (BF16, FP8 fast accumulation)
  kPingpong128x128,     // 128 x 128, ping-pong, cluster 2 x 1 (BF16, FP8 fast accumulation)
  // sfmoe's own kernel (BF16 fprop and dgrad into BF16; sm90_contiguous_grouped_gemm.cu): one
  // TMA descriptor per operand, a device tile scheduler over the offsets, cluster 1
  kContiguous128x256,
  kContiguous128x192,
  kContiguous128x128,
  // the same kernel in 2-CTA clusters along M multicasting W's tile
  kContiguous128x256Cluster2,
  kContiguous128x192Cluster2,
  // sfmoe's own wgrad kernel (BF16 into BF16; sm90_wgrad_grouped_gemm.cu): per-group descriptors
  // written once per call, the epilogue's TMA stores overlapping the next tile's mainloop
  kWgrad128x256,
  kWgrad128x256Cluster2,  // the same in 2-CTA clusters along M multicasting X's tile
  kWgrad128x192,          // 128 x 192 in four stages (128 x 256 fits three)
  // sfmoe's own FP8 blockwise kernel (fprop and dgrad into BF16;
  // sm90_contiguous_blockwise_gemm.cu): the contiguous kernel's scheme around CUTLASS's
  // blockwise-scaled mainloop, 128 x 128 x 128
  kBlockwiseContiguous128x128,
  kBlockwiseContiguous128x128Cluster2,  // in 2-CTA clusters along M multicasting W's tile
};

enum class GemmRecipe {
  kBf16,
  kFp8Tensor,      // per-tensor scales, FP32 promotion every 4 MMAs
  kFp8TensorFast,  // per-tensor scales, the tensor cores' own accumulation (fast accumulation)
  kFp8Blockwise,   // 1x128 x 128x128 scales applied per K block
};

// Whether the tile is one of sfmoe's own kernel (sm90_contiguous_grouped_gemm.cu).
inline bool is_contiguous_tile(GemmTile tile) {
  return tile == GemmTile::kContiguous128x256 || tile == GemmTile::kContiguous128x192 ||
         tile == GemmTile::kContiguous128x128 || tile == GemmTile::kContiguous128x256Cluster2 ||
         tile == GemmTile::kContiguous128x192Cluster2;
}

// Whether the tile is sfmoe's own FP8 blockwise kernel (sm90_contiguous_blockwise_gemm.cu).
inline bool is_blockwise_contiguous_tile(GemmTile tile) {
  return tile == GemmTile::kBlockwiseContiguous128x128 ||
         tile == GemmTile::kBlockwiseContiguous128x128Cluster2;
}

// Whether the tile is sfmoe's own wgrad kernel (sm90_wgrad_grouped_gemm.cu).
inline bool is_wgrad_tile(GemmTile tile) {
  return tile == GemmTile::kWgrad128x256 || tile == GemmTile::kWgrad128x256Cluster2 ||
         tile == GemmTile::kWgrad128x192;
}

// The tile a SFMOE_GEMM_TILE value names (coop128, coop256, pingpong64, coop256x128,
// pingpong128, contig256, contig192, contig128, contig256c2, contig192c2, wgrad256,
// wgrad256c2, wgrad192, blockwise128, blockwise128c2); none for another value.
inline std::optional<GemmTile> gemm_tile_named(const char* name) {
  if (name == nullptr) return std::nullopt;
  if (strcmp(name, "coop128") == 0) return GemmTile::kCooperative128x128;
  if (strcmp(name, "coop256") == 0) return GemmTile::kCooperative128x256;
  if (strcmp(name, "pingpong64") == 0) return GemmTile::kPingpong64x128;
  if (strcmp(name, "coop256x128") == 0) return GemmTile::kCooperative256x128;
  if (strcmp(name, "pingpong128") == 0) return GemmTile::kPingpong128x128;
  if (strcmp(name, "contig256") == 0) return GemmTile::kContiguous128x256;
  if (strcmp(name, "contig192") == 0) return GemmTile::kContiguous128x192;
  if (strcmp(name, "contig128") == 0) return GemmTile::kContiguous128x128;
  if (strcmp(name, "contig256c2") == 0) return GemmTile::kContiguous128x256Cluster2;
  if (strcmp(name, "contig192c2") == 0) return GemmTile::kContiguous128x192Cluster2;
  if (strcmp(name, "wgrad256") == 0) return GemmTile::kWgrad128x256;
  if (strcmp(name, "wgrad256c2") == 0) return GemmTile::kWgrad128x256Cluster2;
  if (strcmp(name, "wgrad192") == 0) return GemmTile::kWgrad128x192;
  if (strcmp(name, "blockwise128") == 0) return GemmTile::kBlockwiseContiguous128x128;
  if (strcmp(name, "blockwise128c2") == 0) return GemmTile::kBlockwiseContiguous128x128Cluster2;
  return std::nullopt;
}

// The measured families differ by recipe, by the GEMM's M per group (the rows' bound over the
// groups in fprop and dgrad; n in wgrad) and, for FP8 fast accumulation, by the GEMM's K (the
// reduction length: k in fprop, n in dgrad, the rows per group in wgrad) and N (n in fprop, k in
// dgrad and wgrad).
constexpr int64_t kFastAccumulationPingpongMaxK = 4096;
constexpr int64_t kFastAccumulationPingpongMinN = 2048;
constexpr int64_t kBf16WgradPingpongMaxK = 1024;  // BF16 wgrad: the rows per group
constexpr int64_t kBf16WgradPingpongMinN = 4096;  // BF16 wgrad: k
inline GemmTile choose_gemm_tile(GemmRecipe recipe, int64_t gemm_m_bound_per_group, int64_t gemm_n,
                                 int64_t gemm_k) {
  GemmTile chosen = GemmTile::kCooperative128x128;
  if (recipe == GemmRecipe::kBf16) {
    chosen =
        gemm_m_bound_per_group < 128 ? GemmTile::kPingpong64x128 : GemmTile::kCooperative128x256;
  } else if (recipe == GemmRecipe::kFp8Tensor) {
    chosen =
        gemm_m_bound_per_group < 128 ? GemmTile::kPingpong64x128 : GemmTile::kCooperative128x128;
  } else if (recipe == GemmRecipe::kFp8TensorFast) {
    const bool pingpong =
        gemm_k <= kFastAccumulationPingpongMaxK && gemm_n >= kFastAccumulationPingpongMinN;
    chosen = pingpong ? GemmTile::kPingpong128x128 : GemmTile::kCooperative128x256;
  }
  return chosen;
}

// sfmoe's own kernel (BF16 fprop and dgrad into BF16), bench/bench_grouped_gemm_forms.py, 36
// cases, each kernel in its own process beside torch._grouped_mm, two runs (2026-12-04): 2-CTA
// clusters multicasting W's tile (each CTA loads half of it), with a group's odd last tile shared
// by the pair (64 rows each), 0.984x / 0.986x the peer against 0.974x / 0.958x for one CTA; +2-4%
// on balanced groups (whole tiles, even counts), -3..+9% on Zipf ones. The GPU runs these at its
// 700 W power limit (SM clock 1425 MHz median of 1980), so the L2 traffic multicast saves buys
// clock. In the MoE layer (routed groups: a partial last tile in every group) that first form cost
// Qwen3-30B-A3B 1-3% at 512 rows per group and 6% at 128, as the pair split a group's odd last
// tile 64 rows each (more than half a tile's time); taking that tile as two N blocks sharing A
// instead, clusters gain 2-4% in the layer at DeepSeek-V3-local and Mixtral and tie at Qwen3 (512
// and 128 rows per group), 0.997x over the forms benchmark: clusters for every group size.
// 192-wide tiles where they cover N in fewer columns than 256-wide ones (N 2880: 15 tiles of 192 =
// 2880 columns against 12 of 256 = 3072; N 5760: 5760 against 5888): gpt-oss-120b's four cases
// 0.96-1.02x against 0.93-0.97x; elsewhere 192 measured 1-5% behind 256. Where both cover N alike
// (multiples of 768) or 256 covers less, 256: fewer tiles, each with more MMAs per load.
inline bool contiguous_tile_192_pads_less(int64_t gemm_n) {
  const int64_t cover_192 = (gemm_n + 191) / 192 * 192, cover_256 = (gemm_n + 255) / 256 * 256;
  return cover_192 < cover_256;
}

// The own contiguous kernel's tile for BF16 fprop or dgrad: 2-CTA clusters, 192 wide where that
// tiles the GEMM's N (n in fprop, k in dgrad) with fewer padded columns than 256.
inline GemmTile contiguous_tile_for(GroupedGemmForm form, int64_t n, int64_t k) {
  const int64_t gemm_n = form == GroupedGemmForm::kFprop ? n : k;
  return contiguous_tile_192_pads_less(gemm_n) ? GemmTile::kContiguous128x192Cluster2
                                               : GemmTile::kContiguous128x256Cluster2;
}

// The CUTLASS tile for a call: the GEMM's M bound per group, N and K of the form (fprop Y [M, n]
// = X [M, k] W^T; dgrad dX [M, k] = dY [M, n] W; wgrad dW [n, k] = dY^T X, reduced over a group's
// rows, whose bound per group is row_capacity / num_groups). It also runs the calls an own
// kernel's tile does not take (FP32 results, wgrad accumulation).
inline GemmTile choose_cutlass_tile_for(GroupedGemmForm form, GemmRecipe recipe,
                                        int64_t row_capacity, int64_t num_groups, int64_t n,
                                        int64_t k) {
  const int64_t rows_per_group = num_groups > 0 ? row_capacity / num_groups : row_capacity;
  switch (form) {
    case GroupedGemmForm::kFprop:
      return choose_gemm_tile(recipe, rows_per_group, n, k);
    case GroupedGemmForm::kDgrad:
      return choose_gemm_tile(recipe, rows_per_group, k, n);
    case GroupedGemmForm::kWgrad:
      break;
  }
  const GemmTile chosen = choose_gemm_tile(recipe, n, k, rows_per_group);
  // BF16 wgrad, a short reduction into a wide output: ping-pong where 128 x 256 would run.
  if (recipe == GemmRecipe::kBf16 && chosen == GemmTile::kCooperative128x256 &&
      rows_per_group <= kBf16WgradPingpongMaxK && k >= kBf16WgradPingpongMinN) {
    return GemmTile::kPingpong128x128;
  }
  return chosen;
}

// sfmoe's own wgrad kernel (BF16 into BF16), bench probe of 2026-12-04 (each tile in its own
// process after the other, dense cuBLAS and torch._grouped_mm beside the heuristic's tile): where
// CUTLASS runs 128 x 256, the own kernel measured +3% at Qwen3-30B-A3B's fc1 and fc2 (512 rows a
// group: 493 / 480 against 477 / 464 TFLOP/s), +3.5% at DeepSeek-V3's fc2 (1024 rows, n 7168, k
// 2048: 587 / 567) and +2.5% at gpt-oss-120b's fc1 (256 rows: 372 / 363), and -3% at Mixtral's
// fc1 (2048 rows, n 28672: 546 / 561), whose longer mainloops leave the epilogue less to hide;
// CUTLASS's ping-pong for DeepSeek-V3's fc1 stays (618 against the own 589).
constexpr int64_t kOwnWgradMaxRowsPerGroup = 1024;

// The choice for a call: BF16 fprop and dgrad run sfmoe's own kernel in 2-CTA clusters where
// CUTLASS's 128 x 256 would run (it takes BF16 results only; the others run the CUTLASS tile),
// 192 wide where that tiles the GEMM's N with fewer padded columns; BF16 wgrad runs the own wgrad
// kernel there up to kOwnWgradMaxRowsPerGroup rows per group (BF16 results without accumulation;
// the others run the CUTLASS tile).
inline GemmTile choose_gemm_tile_for(GroupedGemmForm form, GemmRecipe recipe, int64_t row_capacity,
                                     int64_t num_groups, int64_t n, int64_t k) {
  const GemmTile cutlass_tile =
      choose_cutlass_tile_for(form, recipe, row_capacity, num_groups, n, k);
  if (recipe != GemmRecipe::kBf16 || cutlass_tile != GemmTile::kCooperative128x256) {
    return cutlass_tile;
  }
  if (form == GroupedGemmForm::kWgrad) {
    const int64_t rows_per_group = num_groups > 0 ? row_capacity / num_groups : row_capacity;
    return rows_per_group <= kOwnWgradMaxRowsPerGroup ? GemmTile::kWgrad128x256 : cutlass_tile;
  }
  return contiguous_tile_for(form, n, k);
}

}  // namespace cuda
}  // namespace sfmoe

// Grouped quantization's launch choices, from the host's bounds and the buffers' addresses
// (docs/KERNEL_NOTES.md, grouped quantization).
#pragma once

#include <stdint.h>

#include <algorithm>

namespace sfmoe {
namespace cuda {

// The tile kernel's compiled tunables; docs/KERNEL_NOTES.md has what other settings measured.
constexpr int kTileRingStages = 3;         // shared tiles of the columnwise ring (q8: 4, no faster)
constexpr int kRowwiseMinBlocks = 3;       // blocks per SM the registers allow (q8, q12: 2, slower)
constexpr int kNvfp4RowwiseMinBlocks = 2;  // NVFP4's encoding needs more registers (q17: 3 spills)
constexpr int kColumnwiseMinBlocks = 1;    // 512 threads at 128 registers
constexpr int kAmaxPassMinBlocks = 4;      // the tile kernel's amax pass, no spills (q7)
constexpr int kRowwiseUnitsPerBlock = 32;  // work units per resident block (q16)
constexpr int kColumnwiseUnitsPerBlock = 16;  // (q16)

// The amax row stream's grid: two runs of rows per resident warp (each warp's run length comes
// from the real rows on the device), or, with `rows_per_warp` > 0 (tests), as many blocks as
// runs of that length take.
inline int64_t amax_rows_blocks(int64_t row_capacity, int64_t resident_blocks, int warps_per_block,
                                int64_t rows_per_warp) {
  if (rows_per_warp > 0) {
    const int64_t rows_per_block = rows_per_warp * warps_per_block;
    return std::max<int64_t>(1, (row_capacity + rows_per_block - 1) / rows_per_block);
  }
  const int64_t blocks_for_rows = (row_capacity + warps_per_block - 1) / warps_per_block;
  return std::max<int64_t>(1, std::min<int64_t>(2 * resident_blocks, blocks_for_rows));
}

// Compact columnwise MXFP8 / 1x128 scales go through units of eight bands (kUnitBands) when each
// column's scales start on a 32-byte sector (the capacity a multiple of 1024 rows and the array
// 32-byte aligned), so that a unit writes whole sectors: q22, 1x128 +col 0.627 -> 0.622 ms, MXFP8
// +col 0.647 -> 0.600. Off the sectors the staging measured no gain (q22 in the Python harness).
inline bool columnwise_scales_in_unit_bands(int64_t row_capacity, int block, int scale_bytes,
                                            const void* columnwise_scales) {
  const int64_t column_bytes = row_capacity / block * scale_bytes;
  return column_bytes % 32 == 0 && reinterpret_cast<uintptr_t>(columnwise_scales) % 32 == 0;
}

}  // namespace cuda
}  // namespace sfmoe

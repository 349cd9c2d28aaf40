// Where an MX / NV block scale lives in the tensor-core ("swizzled") scale layout.
// Scales form a [rows, scale_cols] matrix padded to [roundup(rows, 128), roundup(scale_cols, 4)];
// it is cut into tiles of 128 rows x 4 scale columns stored one after another in row-major tile
// order (512 bytes each); inside a tile, row i and column j sit at
// (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4).
#pragma once

#include "sfmoe/numerics/bits.h"

namespace sfmoe {
namespace numerics {

constexpr int64_t kSwizzleTileRows = 128;
constexpr int64_t kSwizzleTileCols = 4;
constexpr int64_t kSwizzleTileElements = kSwizzleTileRows * kSwizzleTileCols;

SFMOE_HD int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

SFMOE_HD int64_t swizzled_scale_padded_size(int64_t rows, int64_t scale_cols) {
  return round_up(rows, kSwizzleTileRows) * round_up(scale_cols, kSwizzleTileCols);
}

// Positions are never negative: computed unsigned, the divisions and remainders by the powers of
// two above are single shifts and masks (kernels compute one offset per 32 or 16 values).
SFMOE_HD int64_t swizzled_scale_offset(int64_t row, int64_t col, int64_t scale_cols) {
  constexpr uint64_t kRows = kSwizzleTileRows, kCols = kSwizzleTileCols;
  const uint64_t r = static_cast<uint64_t>(row), c = static_cast<uint64_t>(col);
  const uint64_t tiles_per_row = (static_cast<uint64_t>(scale_cols) + kCols - 1) / kCols;
  const uint64_t tile = (r / kRows) * tiles_per_row + c / kCols;
  const uint64_t inside = (r % 32) * 16 + ((r % kRows) / 32) * 4 + (c % kCols);
  return static_cast<int64_t>(tile * kSwizzleTileElements + inside);
}

// The inverse: the (row, col) of the padded scale matrix stored at `offset`.
SFMOE_HD void swizzled_scale_position(int64_t offset, int64_t scale_cols, int64_t* row,
                                      int64_t* col) {
  const int64_t tiles_per_row = round_up(scale_cols, kSwizzleTileCols) / kSwizzleTileCols;
  const int64_t tile = offset / kSwizzleTileElements, inside = offset % kSwizzleTileElements;
  *row = (tile / tiles_per_row) * kSwizzleTileRows + ((inside % 16) / 4) * 32 + inside / 16;
  *col = (tile % tiles_per_row) * kSwizzleTileCols + inside % 4;
}

}  // namespace numerics
}  // namespace sfmoe

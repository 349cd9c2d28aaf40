// The grouped-quantization operations as the API layer hands them to a backend, after validation:
// plain pointers and sizes. The rules they implement are in docs/quantization.md.
#pragma once

#include "sfmoe/numerics/scale_swizzle.h"
#include "sfmoe/numerics/scaling.h"
#include "sfmoe/quantize.h"
#include "src/common/group_offsets.h"

namespace sfmoe {

struct GroupedInput {
  const void* data;   // [row_capacity, cols]
  sfmoe_dtype dtype;  // FP32, BF16 or FP16
  int64_t row_capacity;
  const int64_t* offsets;  // num_groups + 1, or NULL with uniform_rows > 0
  int64_t uniform_rows;
};

// Each group's amax of high-precision rows (sfmoe_grouped_amax).
struct GroupedAmaxArgs {
  GroupedInput input;
  int64_t num_groups, cols;
  float* amax;               // [num_groups], written
  sfmoe_fault_report* word;  // or NULL
};

// Compact [rows, scale_cols] byte scales to the swizzled tensor-core layout, or back.
struct SwizzleArgs {
  const uint8_t* from;
  int64_t rows, scale_cols;
  uint8_t* to;
  bool unswizzle;  // from is swizzled, to compact
};

struct GroupedQuantizeArgs {
  GroupedInput input;
  int64_t num_groups;
  int64_t cols;
  sfmoe_dtype dtype;  // FP8_E4M3, FP8_E5M2 or FP4_E2M1
  sfmoe_scaling scaling;
  sfmoe_scale_layout scale_layout;
  int64_t row_capacity;   // R of the output
  int64_t row_alignment;  // a
  int64_t* offsets;       // out_off, written; NULL with uniform groups
  int64_t uniform_rows;   // > 0: uniform output groups (equal to the input's)
  void* rowwise;          // [R, C] codes or NULL
  // The rowwise copy's scales. 2D-block scalings also write them without the rowwise codes (the
  // columnwise copy's blocks hold the same scales, and the FP8 128x128 dgrad reads them so).
  void* rowwise_scale_inv;
  void* columnwise;  // [C, R] codes or NULL
  void* columnwise_scale_inv;
  float* amax;             // [num_groups] (TENSOR, NV)
  float* columnwise_amax;  // [num_groups] (NV with the Hadamard transform and a columnwise copy)
  sfmoe_quantize_config config;
  sfmoe_fault_report* word;  // NULL: faults are not recorded
};

struct GroupedDequantizeArgs {
  // The quantized tensor, described as for quantize (offsets are read, not written).
  GroupedQuantizeArgs quantized;
  bool from_columnwise;
  void* output;              // [R, C]
  sfmoe_dtype output_dtype;  // FP32, BF16 or FP16
};

// ---- rules shared by the backends (host + device)
// -------------------------------------------------

// TENSOR: group g's scale (docs/quantization.md): the caller's (config.tensor_scales, delayed
// scaling) or the current scaling from the group amax.
SFMOE_HD float tensor_scale_of_group(const sfmoe_quantize_config& c, int64_t g, float group_amax,
                                     float fp8_max) {
  return c.tensor_scales != nullptr
             ? c.tensor_scales[g]
             : numerics::fp8_scale_from_amax(group_amax, fp8_max, c.power_of_two_scales != 0);
}

// FP32, BF16 or FP16: the values of unquantized rows (scaling NONE).
SFMOE_HD bool is_high_precision(sfmoe_dtype d) {
  return d == SFMOE_DTYPE_FP32 || d == SFMOE_DTYPE_BF16 || d == SFMOE_DTYPE_FP16;
}

// The element dtypes each scaling holds: high-precision values for NONE, FP8 codes for the FP8
// recipes and MXFP8, E2M1 for NVFP4.
SFMOE_HD bool scaling_accepts(sfmoe_scaling scaling, sfmoe_dtype dtype) {
  switch (scaling) {
    case SFMOE_SCALING_NONE:
      return is_high_precision(dtype);
    case SFMOE_SCALING_TENSOR:
    case SFMOE_SCALING_BLOCK_1X128:
    case SFMOE_SCALING_BLOCK_128X128:
    case SFMOE_SCALING_MX_1X32:
      return dtype == SFMOE_DTYPE_FP8_E4M3 || dtype == SFMOE_DTYPE_FP8_E5M2;
    case SFMOE_SCALING_NV_1X16:
    case SFMOE_SCALING_NV_16X16:
      return dtype == SFMOE_DTYPE_FP4_E2M1;
  }
  return false;
}

// Elements per block along the quantized direction (the block height for columnwise copies and
// the side of 2D blocks); 0 for TENSOR (one scale per group).
SFMOE_HD int64_t scaling_block_size(sfmoe_scaling scaling) {
  switch (scaling) {
    case SFMOE_SCALING_BLOCK_1X128:
    case SFMOE_SCALING_BLOCK_128X128:
      return 128;
    case SFMOE_SCALING_MX_1X32:
      return 32;
    case SFMOE_SCALING_NV_1X16:
    case SFMOE_SCALING_NV_16X16:
      return 16;
    default:
      return 0;
  }
}

// The dtype of the scale entries, or SFMOE_DTYPE_COUNT for a scaling without scales.
SFMOE_HD sfmoe_dtype scale_dtype_of(sfmoe_scaling scaling) {
  switch (scaling) {
    case SFMOE_SCALING_TENSOR:
    case SFMOE_SCALING_BLOCK_1X128:
    case SFMOE_SCALING_BLOCK_128X128:
      return SFMOE_DTYPE_FP32;
    case SFMOE_SCALING_MX_1X32:
      return SFMOE_DTYPE_E8M0;
    case SFMOE_SCALING_NV_1X16:
    case SFMOE_SCALING_NV_16X16:
      return SFMOE_DTYPE_FP8_E4M3;
    default:
      return static_cast<sfmoe_dtype>(SFMOE_DTYPE_COUNT);
  }
}

// The scalings whose scales may use the swizzled tensor-core layout.
SFMOE_HD bool scaling_is_swizzlable(sfmoe_scaling scaling) {
  return scaling == SFMOE_SCALING_MX_1X32 || scaling == SFMOE_SCALING_NV_1X16;
}

SFMOE_HD bool scaling_is_2d(sfmoe_scaling scaling) {
  return scaling == SFMOE_SCALING_BLOCK_128X128 || scaling == SFMOE_SCALING_NV_16X16;
}

SFMOE_HD bool scaling_is_nvfp4(sfmoe_scaling scaling) {
  return scaling == SFMOE_SCALING_NV_1X16 || scaling == SFMOE_SCALING_NV_16X16;
}

// The smallest output row alignment that keeps row-running blocks inside groups.
SFMOE_HD int64_t min_row_alignment(sfmoe_scaling scaling, bool has_columnwise) {
  if (scaling_is_2d(scaling) || has_columnwise) {
    const int64_t block = scaling_block_size(scaling);
    return block > 0 ? block : 1;
  }
  return 1;
}

// Whether `scaling` can store its scales in `layout`.
SFMOE_HD bool scaling_has_layout(sfmoe_scaling scaling, sfmoe_scale_layout layout) {
  switch (layout) {
    case SFMOE_SCALE_LAYOUT_COMPACT:
      return true;
    case SFMOE_SCALE_LAYOUT_SWIZZLED:
      return scaling_is_swizzlable(scaling);
    case SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED:
      return scaling == SFMOE_SCALING_BLOCK_1X128;
  }
  return false;
}

// Where a BLOCK_1X128 copy stores the scale of its row `major`, block `block` (of `blocks` per
// row), the copy having `copy_rows` rows: compact [copy_rows, blocks], or, for the columnwise
// copy in the columnwise-transposed layout, [blocks, copy_rows].
SFMOE_HD int64_t block_1x128_scale_offset(sfmoe_scale_layout layout, bool columnwise, int64_t major,
                                          int64_t block, int64_t blocks, int64_t copy_rows) {
  return columnwise && layout == SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED
             ? block * copy_rows + major
             : major * blocks + block;
}

// Where the scale of block (block_row, block_col) of a [rows, scale_cols] scale matrix is stored.
SFMOE_HD int64_t scale_offset(sfmoe_scale_layout layout, int64_t block_row, int64_t block_col,
                              int64_t scale_cols) {
  return layout == SFMOE_SCALE_LAYOUT_SWIZZLED
             ? numerics::swizzled_scale_offset(block_row, block_col, scale_cols)
             : block_row * scale_cols + block_col;
}

// Output group offsets of a quantized tensor: explicit offsets or uniform groups.
SFMOE_HD int64_t quantized_group_offset(const GroupedQuantizeArgs& a, int64_t g) {
  return a.offsets ? a.offsets[g] : g * a.uniform_rows;
}

SFMOE_HD int64_t quantized_group_of_row(const GroupedQuantizeArgs& a, int64_t r) {
  if (a.offsets == nullptr) return r / a.uniform_rows;
  return group_of_offset_row(a.offsets, a.num_groups, r);
}

// ---- dequantize (docs/quantization.md, Dequantize) ---------------------------------------------

// The rows decoded: [0, end of the last group) clamped into the capacity (device offsets come
// unchecked; nothing outside the buffers is read or written for bad ones).
SFMOE_HD int64_t dequantized_rows(const GroupedQuantizeArgs& q) {
  const int64_t end = quantized_group_offset(q, q.num_groups);
  return end < 0 ? 0 : (end > q.row_capacity ? q.row_capacity : end);
}

// NVFP4: group g's global decode scale 1 / S_enc for the copy read (the columnwise copy's own
// amax when it carries the Hadamard transform); 1 for the other recipes. Kernels compute it once
// per group or row, not per element.
SFMOE_HD float dequantize_global_decode(const GroupedQuantizeArgs& q, bool from_columnwise,
                                        int64_t g) {
  if (!scaling_is_nvfp4(q.scaling)) return 1.0f;
  const bool transformed =
      from_columnwise && q.scaling == SFMOE_SCALING_NV_1X16 && q.config.hadamard_columnwise != 0;
  return numerics::nvfp4_global_decode_scale(
      numerics::nvfp4_global_encode_scale(transformed ? q.columnwise_amax[g] : q.amax[g]));
}

// The FP32 factor that decodes element (r, c) of the rowwise matrix from one copy: r's group g,
// and global_decode = dequantize_global_decode(q, from_columnwise, g). A value is
// mul_rn(decoded code, factor) on every backend.
SFMOE_HD float dequantize_factor(const GroupedQuantizeArgs& q, bool from_columnwise, int64_t r,
                                 int64_t c, int64_t g, float global_decode) {
  const void* scales = from_columnwise ? q.columnwise_scale_inv : q.rowwise_scale_inv;
  const int64_t block = scaling_block_size(q.scaling);
  const int64_t cols = from_columnwise ? q.row_capacity : q.cols;  // of the copy
  const int64_t m = from_columnwise ? c : r, n = from_columnwise ? r : c;
  switch (q.scaling) {
    case SFMOE_SCALING_TENSOR:
      return static_cast<const float*>(scales)[g];
    case SFMOE_SCALING_BLOCK_1X128:
      return static_cast<const float*>(scales)[block_1x128_scale_offset(
          q.scale_layout, from_columnwise, m, n / block, cols / block,
          from_columnwise ? q.cols : q.row_capacity)];
    case SFMOE_SCALING_BLOCK_128X128:
      return static_cast<const float*>(scales)[(m / block) * (cols / block) + n / block];
    case SFMOE_SCALING_MX_1X32:
      return numerics::e8m0_to_f32(static_cast<const uint8_t*>(
          scales)[scale_offset(q.scale_layout, m, n / block, cols / block)]);
    case SFMOE_SCALING_NV_1X16:
    case SFMOE_SCALING_NV_16X16: {
      const int64_t offset = q.scaling == SFMOE_SCALING_NV_1X16
                                 ? scale_offset(q.scale_layout, m, n / block, cols / block)
                                 : (m / block) * (cols / block) + n / block;
      return numerics::mul_rn(numerics::e4m3_to_f32(static_cast<const uint8_t*>(scales)[offset]),
                              global_decode);
    }
    default:
      return 0.0f;
  }
}

}  // namespace sfmoe

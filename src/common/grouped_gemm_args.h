// The grouped GEMM's arguments (docs/grouped_gemm.md): the CPU reference's (FP32 operands,
// quantized ones dequantized from the copy each form reads, group offsets over the rows M, uniform
// [N, K] weights per group) and the device path's (the copies read as they lie, offsets and a
// workspace in device memory).
#pragma once

#include <stdint.h>

#include "sfmoe/sfmoe.h"

namespace sfmoe {

enum class GroupedGemmForm {
  kFprop,  // Y_g [M_g, N] = X_g [M_g, K] . W_g^T
  kDgrad,  // dX_g [M_g, K] = dY_g [M_g, N] . W_g
  kWgrad,  // dW_g [N, K] (+)= dY_g^T [N, M_g] . X_g [M_g, K]
};

struct GroupedGemmArgs {
  GroupedGemmForm form;
  int64_t num_groups;
  const int64_t* offsets;  // [num_groups + 1]: group g owns rows [offsets[g], offsets[g + 1])
  int64_t n, k;            // each group's weight is [n, k]
  const float* a;          // fprop: X [rows, k]; dgrad and wgrad: dY [rows, n]
  const float* b;          // fprop and dgrad: W [num_groups, n, k]; wgrad: X [rows, k]
  void* out;               // fprop: Y [rows, n]; dgrad: dX [rows, k]; wgrad: dW [num_groups, n, k]
  sfmoe_dtype out_dtype;   // FP32 or BF16 (FP16 too); wgrad accumulation needs FP32
  bool accumulate;         // wgrad only: dW += instead of =
};

// The device path (docs/grouped_gemm.md): each operand as the copy the form's kernel reads, the
// rows' group offsets on the device, a caller workspace for the per-group arguments.
struct GemmDeviceOperand {
  const void* data;        // the copy read: rowwise [rows, cols], or columnwise [cols, rows]
  sfmoe_dtype dtype;       // BF16, FP8_E4M3 or FP8_E5M2
  sfmoe_scaling scaling;   // NONE (BF16), TENSOR, BLOCK_1X128 or BLOCK_128X128
  bool columnwise;         // data is the columnwise copy
  int64_t rows;            // the tensor's row_capacity (the columnwise copy's leading dimension)
  const float* scale_inv;  // TENSOR: [num_groups] of the copy read; BLOCK_1X128: the copy
                           // read's scales (rowwise [rows, cols / 128]; columnwise transposed,
                           // [rows / 128, cols]); BLOCK_128X128: the rowwise scales
                           // [rows / 128, cols / 128] (also when the columnwise data is read:
                           // the two hold the same values); NULL for BF16
};

struct GroupedGemmDeviceArgs {
  GroupedGemmForm form;
  int64_t num_groups;
  const int64_t* offsets;  // device [num_groups + 1], a's (and b's in wgrad)
  int64_t row_capacity;    // rows of a (and of out in fprop / dgrad)
  int64_t n, k;
  GemmDeviceOperand a, b;
  void* out;
  sfmoe_dtype out_dtype;   // BF16 or FP32
  bool accumulate;         // wgrad into FP32 dW
  bool fast_accumulation;  // FP8 per-tensor: the tensor cores' own accumulation over all of K
  void* workspace;         // device, workspace_bytes
  int64_t workspace_bytes;
  sfmoe_fault_report* word;  // or NULL
};

}  // namespace sfmoe

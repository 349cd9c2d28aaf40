// The grouped GEMM's arguments (docs/grouped_gemm.md): the CPU reference's (FP32 operands,
// quantized ones dequantized from the copy each form reads, group offsets over the rows M, uniform
// [N, K] weights per group) and the device path's (the copies read as they lie, offsets and a
// workspace in device memory).
#pragma once

#include <stdint.h>

#include "sfmoe/sfmoe.h"
#include "src/common/quantize_args.h"

namespace sfmoe {

// The most groups a call with gathered rows (GroupedGemmArgs::a_row_index) takes on the device:
// the own fprop / dgrad kernel's bound (its groups' prefix in shared memory).
constexpr int64_t kGatheredGemmMaxGroups = 768;

enum class GroupedGemmForm {
  kFprop,  // Y_g [M_g, N] = X_g [M_g, K] . W_g^T
  kDgrad,  // dX_g [M_g, K] = dY_g [M_g, N] . W_g
  kWgrad,  // dW_g [N, K] (+)= dY_g^T [N, M_g] . X_g [M_g, K]
};

// The CPU reference's operands: FP32 values (src/cpu/grouped_gemm.cpp).
struct GroupedGemmValues {
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

// One operand of a call, as both backends take it: the grouped tensor described as for the
// grouped quantization (unquantized rows: scaling NONE, the values in `rowwise`; quantized: codes,
// scales and amax of both copies, config.hadamard_columnwise saying whether the columnwise copy
// carries the Hadamard transform), and which copy the form reads.
struct GemmOperand {
  GroupedQuantizeArgs tensor;
  bool columnwise;
};

// One grouped GEMM call (docs/grouped_gemm.md), as the backend table takes it.
struct GroupedGemmArgs {
  GroupedGemmForm form;
  int64_t num_groups;
  const int64_t* offsets;  // [num_groups + 1], a's (and b's in wgrad)
  int64_t row_capacity;    // rows of a (and of out in fprop / dgrad)
  int64_t n, k;            // each group's weight is [n, k]
  GemmOperand a, b;        // fprop: X, W; dgrad: dY, W; wgrad: dY, X
  void* out;               // fprop: Y [rows, n]; dgrad: dX [rows, k]; wgrad: dW [num_groups, n, k]
  sfmoe_dtype out_dtype;
  bool accumulate;           // wgrad only: dW += instead of =
  bool fast_accumulation;    // device, FP8 per-tensor: the tensor cores' own accumulation
  void* workspace;           // device: sfmoe_grouped_gemm_workspace_bytes(...)
  int64_t workspace_bytes;   // (the host needs none)
  sfmoe_fault_report* word;  // device: or NULL
  // fprop and dgrad, unquantized a: A's rows gathered from a's data, which then holds
  // a_source_rows rows: A's row r is row a_row_index[r] of it, a zero row where that lies outside
  // [0, a_source_rows). NULL: A's rows as they lie.
  const int32_t* a_row_index = nullptr;  // [row_capacity], in a's memory
  int64_t a_source_rows = 0;
};

// The device kernels (docs/grouped_gemm.md): each operand as the copy the form's kernel reads, the
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
  sfmoe_fault_report* word;              // or NULL
  const int32_t* a_row_index = nullptr;  // as GroupedGemmArgs' (BF16 fprop and dgrad)
  int64_t a_source_rows = 0;
};

// MXFP8 / NVFP4 on the device (emulated: Hopper has no block-scaled MMA for them): the workspace
// holds the kernels' part, then a's and b's BF16 values, each part 256-byte aligned.
struct GemmEmulationWorkspace {
  int64_t kernel_bytes, a_bytes, b_bytes;
  int64_t total_bytes() const { return kernel_bytes + a_bytes + b_bytes; }
};
inline GemmEmulationWorkspace gemm_emulation_workspace(int64_t kernel_bytes, int64_t a_rows,
                                                       int64_t a_cols, int64_t b_rows,
                                                       int64_t b_cols) {
  auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  return GemmEmulationWorkspace{aligned(kernel_bytes), aligned(a_rows * a_cols * 2),
                                aligned(b_rows * b_cols * 2)};
}

// The recipes the device emulates by decoding to BF16.
inline bool gemm_emulated_on_device(int32_t scaling) {
  return scaling == SFMOE_SCALING_MX_1X32 || scaling == SFMOE_SCALING_NV_1X16 ||
         scaling == SFMOE_SCALING_NV_16X16;
}

}  // namespace sfmoe

// Grouped activations as the backends see them: plain pointers and sizes (docs/activations.md).
#pragma once

#include <stdint.h>

#include "sfmoe/numerics/bits.h"
#include "sfmoe/sfmoe.h"
#include "src/common/quantize_args.h"

namespace sfmoe {

enum class ActivationKind {
  kSwiGLU,         // silu(gate) * up
  kGeGLU,          // gelu_tanh(gate) * up
  kSiLU,           // x * sigmoid(x)
  kGeLU,           // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as x sigmoid(2 (...))
  kSquaredReLU,    // max(x, 0)^2
  kClampedSwiGLU,  // g sigmoid(alpha g) (u + 1), g = min(gate, limit), u = clamp(up, -limit, limit)
};

// Gated kinds read [gate | up]: input row r holds gate in columns [0, cols) and up in
// [cols, 2 cols), matching W1 = [W_gate; W_up] stacked along the output features.
constexpr SFMOE_HD bool activation_is_gated(ActivationKind kind) {
  return kind == ActivationKind::kSwiGLU || kind == ActivationKind::kGeGLU ||
         kind == ActivationKind::kClampedSwiGLU;
}

struct ActivationConfig {
  ActivationKind kind = ActivationKind::kSwiGLU;
  float limit = 7.0f;    // clamped SwiGLU
  float alpha = 1.702f;  // clamped SwiGLU
};

// Rows [offsets[g], offsets[g] + rows[g]) of each group are computed; the rest of each group's
// block (alignment padding) is written as zeros; rows at and beyond offsets[G] are not written.
struct GroupRowsView {
  const int64_t* offsets;  // [num_groups + 1]
  const int64_t* rows;     // [num_groups]: real rows of each group
  int64_t num_groups;
};

struct ActivationArgs {
  ActivationConfig config;
  GroupRowsView groups;
  int64_t cols;             // output columns F (a gated input has 2 F)
  const void* input;        // [row_capacity, F or 2F]
  sfmoe_dtype input_dtype;  // FP32, BF16, FP16
  void* output;             // [row_capacity, F] (unquantized output)
  sfmoe_dtype output_dtype;
  float* amax;  // [num_groups]: each group's amax of the FP32 outputs (propagating NaN), or NULL
  // Fused quantization (device): the output's rowwise MX_1X32 / BLOCK_1X128 recipe; NULL: the
  // output is written unquantized.
  const GroupedQuantizeArgs* quantized;
  int64_t row_capacity = 0;            // device: rows of input and output (bounds the grid)
  sfmoe_fault_report* word = nullptr;  // device: clamped offsets and row counts reported (or NULL)
};

struct ActivationBackwardArgs {
  ActivationConfig config;
  GroupRowsView groups;
  int64_t cols;
  const void* input;  // the forward's input
  sfmoe_dtype input_dtype;
  const void* d_output;  // [row_capacity, F]
  sfmoe_dtype d_output_dtype;
  void* d_input;  // [row_capacity, F or 2F]
  sfmoe_dtype d_input_dtype;
  int64_t row_capacity = 0;            // device: rows of input and output (bounds the grid)
  sfmoe_fault_report* word = nullptr;  // device: clamped offsets and row counts reported (or NULL)
  // Weighted rows (the MoE layer's backward, where each expert row's output is scaled by its
  // routing probability): with row_weights [row_capacity], d_output is the gradient g of the
  // weighted output w_r act(x_r); the rule's upstream gradient is w_r g (FP32), and the call
  // also writes weighted_output [row_capacity, F] = w_r act(x_r) in d_output_dtype (the FC2
  // wgrad operand) and d_row_weights [row_capacity] = sum_j g_rj act(x_r)_j (FP32, column order
  // on the host; padding rows 0 in both). Elementwise in place: d_input may be input and
  // weighted_output may be d_output (each element is read before it is written, by the same
  // thread). NULL: unweighted.
  const float* row_weights = nullptr;
  float* d_row_weights = nullptr;
  void* weighted_output = nullptr;
};

}  // namespace sfmoe

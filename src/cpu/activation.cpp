// Grouped activations, CPU reference (docs/activations.md): per-element rules in
// src/cpu/activation_math.h; real rows computed, padding rows written as zeros.
#include <string.h>

#include <vector>

#include "sfmoe/numerics/scaling.h"
#include "src/cpu/activation_math.h"
#include "src/cpu/backend.h"
#include "src/cpu/element_access.h"

namespace sfmoe {
namespace cpu {

namespace {

struct GateUp {
  float gate, up;  // up is 0 for the kinds without one
};

// Column j of row r: the gate (or the only input) and, for gated kinds, the up value.
GateUp gate_up(const void* input, sfmoe_dtype dtype, bool gated, int64_t cols, int64_t r,
               int64_t j) {
  const int64_t in_cols = gated ? 2 * cols : cols;
  return GateUp{load_value(input, dtype, r * in_cols + j),
                gated ? load_value(input, dtype, r * in_cols + cols + j) : 0.0f};
}

// Calls row_fn(r, g) for the real rows and pad_fn(r) for the padding rows of every group.
template <class RowFn, class PadFn>
void for_each_row(const GroupRowsView& groups, RowFn row_fn, PadFn pad_fn) {
  for (int64_t g = 0; g < groups.num_groups; ++g) {
    const int64_t begin = groups.offsets[g], end = groups.offsets[g + 1];
    const int64_t real_end = begin + groups.rows[g] < end ? begin + groups.rows[g] : end;
    for (int64_t r = begin; r < real_end; ++r) row_fn(r, g);
    for (int64_t r = real_end; r < end; ++r) pad_fn(r);
  }
}

}  // namespace

namespace {

// The activations written unquantized into a.output.
void activation_rows(const ActivationArgs& a) {
  const bool gated = activation_is_gated(a.config.kind);
  if (a.amax != nullptr) {
    for (int64_t g = 0; g < a.groups.num_groups; ++g) a.amax[g] = 0.0f;
  }
  for_each_row(
      a.groups,
      [&](int64_t r, int64_t group) {
        for (int64_t j = 0; j < a.cols; ++j) {
          const GateUp x = gate_up(a.input, a.input_dtype, gated, a.cols, r, j);
          const float y = Activation<float>::forward(a.config, x.gate, x.up);
          if (a.amax != nullptr) a.amax[group] = numerics::amax_accumulate(a.amax[group], y);
          store_value(a.output, a.output_dtype, r * a.cols + j, y);
        }
      },
      [&](int64_t r) {
        for (int64_t j = 0; j < a.cols; ++j)
          store_value(a.output, a.output_dtype, r * a.cols + j, 0.0f);
      });
}

}  // namespace

void activation_forward(const ActivationArgs& a) {
  if (a.quantized == nullptr) {
    activation_rows(a);
    return;
  }
  // The fused form on the host is its definition: the FP32 activations, then the grouped
  // quantization's reference over them with the same offsets.
  std::vector<float> values(static_cast<size_t>(a.row_capacity * a.cols), 0.0f);
  ActivationArgs rows = a;
  rows.output = values.data();
  rows.output_dtype = SFMOE_DTYPE_FP32;
  rows.quantized = nullptr;
  activation_rows(rows);
  const std::vector<int64_t> offsets(a.groups.offsets, a.groups.offsets + a.groups.num_groups + 1);
  GroupedQuantizeArgs quantized = *a.quantized;
  quantized.input =
      GroupedInput{values.data(), SFMOE_DTYPE_FP32, a.row_capacity, offsets.data(), 0};
  // The input's offsets are the output's: nothing is re-aligned (alignment 1 keeps each group's
  // rows where they are, whatever the output descriptor's row_alignment says).
  quantized.row_alignment = 1;
  grouped_quantize(quantized);
}

void activation_backward(const ActivationBackwardArgs& a) {
  const bool gated = activation_is_gated(a.config.kind);
  const int64_t in_cols = gated ? 2 * a.cols : a.cols;
  const bool weighted = a.row_weights != nullptr;
  for_each_row(
      a.groups,
      [&](int64_t r, int64_t) {
        const float weight = weighted ? a.row_weights[r] : 1.0f;
        float d_weight = 0.0f;
        for (int64_t j = 0; j < a.cols; ++j) {
          // Both reads come before the writes: d_input may be input, weighted_output d_output.
          const GateUp x = gate_up(a.input, a.input_dtype, gated, a.cols, r, j);
          float d = load_value(a.d_output, a.d_output_dtype, r * a.cols + j);
          if (weighted) {
            const float y = Activation<float>::forward(a.config, x.gate, x.up);
            d_weight = numerics::add_rn(d_weight, numerics::mul_rn(d, y));
            store_value(a.weighted_output, a.d_output_dtype, r * a.cols + j,
                        numerics::mul_rn(weight, y));
            d = numerics::mul_rn(weight, d);
          }
          float dg = 0.0f, du = 0.0f;
          Activation<float>::backward(a.config, x.gate, x.up, d, &dg, &du);
          store_value(a.d_input, a.d_input_dtype, r * in_cols + j, dg);
          if (gated) store_value(a.d_input, a.d_input_dtype, r * in_cols + a.cols + j, du);
        }
        if (weighted) a.d_row_weights[r] = d_weight;
      },
      [&](int64_t r) {
        for (int64_t j = 0; j < in_cols; ++j)
          store_value(a.d_input, a.d_input_dtype, r * in_cols + j, 0.0f);
        if (weighted) {
          for (int64_t j = 0; j < a.cols; ++j)
            store_value(a.weighted_output, a.d_output_dtype, r * a.cols + j, 0.0f);
          a.d_row_weights[r] = 0.0f;
        }
      });
}

}  // namespace cpu
}  // namespace sfmoe

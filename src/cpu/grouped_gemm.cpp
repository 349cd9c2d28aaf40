// Grouped GEMM CPU reference (docs/grouped_gemm.md): each output element is one FP32 dot product
// over the reduction index in increasing order (products and sums each rounded once, no fused
// multiply-add), then rounded once to the output dtype. Integer-valued operands whose partial sums
// stay below 2^24 therefore give exact results in any summation order, which is how the device's
// tensor-core GEMMs are checked bit for bit.
#include <vector>

#include "src/cpu/backend.h"
#include "src/cpu/element_access.h"

namespace sfmoe {
namespace cpu {

namespace {

// sum over i < count of a[i * a_step] * b[i * b_step], i upward: the one summation rule.
float dot(const float* a, int64_t a_step, const float* b, int64_t b_step, int64_t count) {
  float sum = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    sum = numerics::add_rn(sum, numerics::mul_rn(a[i * a_step], b[i * b_step]));
  }
  return sum;
}

}  // namespace

void grouped_gemm_values(const GroupedGemmValues& g) {
  const int64_t n = g.n, k = g.k;
  for (int64_t group = 0; group < g.num_groups; ++group) {
    const int64_t begin = g.offsets[group], end = g.offsets[group + 1];
    const float* w =
        g.form == GroupedGemmForm::kWgrad ? nullptr : g.b + group * n * k;  // W_g [n, k]
    switch (g.form) {
      case GroupedGemmForm::kFprop:  // Y[m, j] = X[m, :] . W_g[j, :]
        for (int64_t m = begin; m < end; ++m) {
          for (int64_t j = 0; j < n; ++j) {
            store_value(g.out, g.out_dtype, m * n + j, dot(g.a + m * k, 1, w + j * k, 1, k));
          }
        }
        break;
      case GroupedGemmForm::kDgrad:  // dX[m, r] = dY[m, :] . W_g[:, r]
        for (int64_t m = begin; m < end; ++m) {
          for (int64_t r = 0; r < k; ++r) {
            store_value(g.out, g.out_dtype, m * k + r, dot(g.a + m * n, 1, w + r, k, n));
          }
        }
        break;
      case GroupedGemmForm::kWgrad:  // dW_g[j, r] (+)= dY[rows, j] . X[rows, r]
        // An empty group writes zeros, or leaves an accumulator as it was.
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t r = 0; r < k; ++r) {
            float sum = dot(g.a + begin * n + j, n, g.b + begin * k + r, k, end - begin);
            const int64_t index = (group * n + j) * k + r;
            if (g.accumulate) sum = numerics::add_rn(load_value(g.out, g.out_dtype, index), sum);
            store_value(g.out, g.out_dtype, index, sum);
          }
        }
        break;
    }
  }
}

namespace {

// The operand's values as FP32 [row_capacity, cols] (rowwise orientation): unquantized rows
// widened, quantized ones decoded from the copy the form reads (rows no group covers stay 0).
std::vector<float> operand_values(const GemmOperand& o) {
  const GroupedQuantizeArgs& t = o.tensor;
  std::vector<float> values(static_cast<size_t>(t.row_capacity * t.cols), 0.0f);
  if (t.scaling == SFMOE_SCALING_NONE) {
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = load_value(t.rowwise, t.dtype, static_cast<int64_t>(i));
    }
    return values;
  }
  grouped_dequantize(GroupedDequantizeArgs{t, o.columnwise, values.data(), SFMOE_DTYPE_FP32});
  return values;
}

}  // namespace

void grouped_gemm(const GroupedGemmArgs& g) {
  const std::vector<float> a = operand_values(g.a), b = operand_values(g.b);
  grouped_gemm_values(GroupedGemmValues{g.form, g.num_groups, g.offsets, g.n, g.k, a.data(),
                                        b.data(), g.out, g.out_dtype, g.accumulate});
}

}  // namespace cpu
}  // namespace sfmoe

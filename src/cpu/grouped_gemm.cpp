// Grouped GEMM CPU reference (docs/grouped_gemm.md): each output element is one FP32 dot product
// over the reduction index in increasing order (products and sums each rounded once, no fused
// multiply-add), then rounded once to the output dtype. Integer-valued operands whose partial sums
// stay below 2^24 therefore give exact results in any summation order, which is how the device's
// tensor-core GEMMs are checked bit for bit.
#include "src/cpu/backend.h"
#include "src/cpu/element_access.h"

namespace sfmoe {
namespace cpu {

void grouped_gemm(const GroupedGemmArgs& g) {
  const int64_t n = g.n, k = g.k;
  for (int64_t group = 0; group < g.num_groups; ++group) {
    const int64_t begin = g.offsets[group], end = g.offsets[group + 1];
    switch (g.form) {
      case GroupedGemmForm::kFprop:
        for (int64_t m = begin; m < end; ++m) {
          for (int64_t j = 0; j < n; ++j) {
            float sum = 0.0f;
            for (int64_t r = 0; r < k; ++r) {
              sum = numerics::add_rn(
                  sum, numerics::mul_rn(g.a[m * k + r], g.b[(group * n + j) * k + r]));
            }
            store_value(g.out, g.out_dtype, m * n + j, sum);
          }
        }
        break;
      case GroupedGemmForm::kDgrad:
        for (int64_t m = begin; m < end; ++m) {
          for (int64_t r = 0; r < k; ++r) {
            float sum = 0.0f;
            for (int64_t j = 0; j < n; ++j) {
              sum = numerics::add_rn(
                  sum, numerics::mul_rn(g.a[m * n + j], g.b[(group * n + j) * k + r]));
            }
            store_value(g.out, g.out_dtype, m * k + r, sum);
          }
        }
        break;
      case GroupedGemmForm::kWgrad:
        // An empty group writes zeros, or leaves an accumulator as it was.
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t r = 0; r < k; ++r) {
            float sum = 0.0f;
            for (int64_t m = begin; m < end; ++m) {
              sum = numerics::add_rn(sum, numerics::mul_rn(g.a[m * n + j], g.b[m * k + r]));
            }
            const int64_t index = (group * n + j) * k + r;
            if (g.accumulate) sum = numerics::add_rn(load_value(g.out, g.out_dtype, index), sum);
            store_value(g.out, g.out_dtype, index, sum);
          }
        }
        break;
    }
  }
}

}  // namespace cpu
}  // namespace sfmoe

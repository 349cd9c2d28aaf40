// Grouped GEMM CPU reference (docs/grouped_gemm.md): each output element is one FP32 dot product
// over the reduction index in increasing order (products and sums each rounded once, no fused
// multiply-add), then rounded once to the output dtype; a row of outputs is computed at once
// (vectorized across outputs) and rows are split over the host's threads, neither of which
// changes a sum. Integer-valued operands whose partial sums
// stay below 2^24 therefore give exact results in any summation order, which is how the device's
// tensor-core GEMMs are checked bit for bit.
#include <algorithm>
#include <vector>

#include "src/cpu/backend.h"
#include "src/cpu/element_access.h"
#include "src/cpu/parallel.h"

namespace sfmoe {
namespace cpu {

namespace {

// sums[j] over i < count of a[i * a_step] * b[i * b_row + j], i upward: the one summation rule
// (each product and each sum rounded once, no fused multiply-add), for a row of outputs at once:
// the loop over j is independent across outputs, so it vectorizes without changing any sum.
void accumulate_row(const float* a, int64_t a_step, const float* b, int64_t b_row, int64_t count,
                    int64_t width, float* sums) {
  for (int64_t j = 0; j < width; ++j) sums[j] = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    const float av = a[i * a_step];
    const float* row = b + i * b_row;
    for (int64_t j = 0; j < width; ++j)
      sums[j] = numerics::add_rn(sums[j], numerics::mul_rn(av, row[j]));
  }
}

// Rows below this many multiply-adds stay on one thread.
constexpr int64_t kSerialWork = 1 << 16;

int64_t serial_rows(int64_t work_per_row) {
  return work_per_row > 0 ? std::max<int64_t>(1, kSerialWork / work_per_row) : 1;
}

}  // namespace

void grouped_gemm_values(const GroupedGemmValues& g) {
  const int64_t n = g.n, k = g.k;
  std::vector<float> w_t;  // fprop: W_g transposed, [k, n]
  for (int64_t group = 0; group < g.num_groups; ++group) {
    const int64_t begin = g.offsets[group], end = g.offsets[group + 1];
    const float* w =
        g.form == GroupedGemmForm::kWgrad ? nullptr : g.b + group * n * k;  // W_g [n, k]
    switch (g.form) {
      case GroupedGemmForm::kFprop:  // Y[m, j] = X[m, :] . W_g[j, :]
        if (end <= begin) break;
        w_t.resize(static_cast<size_t>(n * k));
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t r = 0; r < k; ++r) w_t[r * n + j] = w[j * k + r];
        }
        parallel_for(end - begin, serial_rows(n * k), [&](int64_t first, int64_t last) {
          std::vector<float> sums(static_cast<size_t>(n));
          for (int64_t m = begin + first; m < begin + last; ++m) {
            accumulate_row(g.a + m * k, 1, w_t.data(), n, k, n, sums.data());
            for (int64_t j = 0; j < n; ++j) store_value(g.out, g.out_dtype, m * n + j, sums[j]);
          }
        });
        break;
      case GroupedGemmForm::kDgrad:  // dX[m, r] = dY[m, :] . W_g[:, r]
        parallel_for(end - begin, serial_rows(n * k), [&](int64_t first, int64_t last) {
          std::vector<float> sums(static_cast<size_t>(k));
          for (int64_t m = begin + first; m < begin + last; ++m) {
            accumulate_row(g.a + m * n, 1, w, k, n, k, sums.data());
            for (int64_t r = 0; r < k; ++r) store_value(g.out, g.out_dtype, m * k + r, sums[r]);
          }
        });
        break;
      case GroupedGemmForm::kWgrad:  // dW_g[j, r] (+)= dY[rows, j] . X[rows, r]
        // An empty group writes zeros, or leaves an accumulator as it was (its operands may hold
        // no rows at all: nothing is read, and no pointer is formed into them).
        parallel_for(n, serial_rows((end - begin) * k), [&](int64_t first, int64_t last) {
          std::vector<float> sums(static_cast<size_t>(k));
          for (int64_t j = first; j < last; ++j) {
            if (end > begin) {
              accumulate_row(g.a + begin * n + j, n, g.b + begin * k, k, end - begin, k,
                             sums.data());
            } else {
              std::fill(sums.begin(), sums.end(), 0.0f);
            }
            for (int64_t r = 0; r < k; ++r) {
              const int64_t index = (group * n + j) * k + r;
              const float sum =
                  g.accumulate ? numerics::add_rn(load_value(g.out, g.out_dtype, index), sums[r])
                               : sums[r];
              store_value(g.out, g.out_dtype, index, sum);
            }
          }
        });
        break;
    }
  }
}

namespace {

// The operand's values as FP32 [row_capacity, cols] (rowwise orientation): unquantized rows
// widened (row r gathered from row row_index[r] of the data, which holds source_rows rows, when
// row_index is given: a zero row for an index outside them), quantized ones decoded from the copy
// the form reads (rows no group covers stay 0).
std::vector<float> operand_values(const GemmOperand& o, const int32_t* row_index = nullptr,
                                  int64_t source_rows = 0) {
  const GroupedQuantizeArgs& t = o.tensor;
  std::vector<float> values(static_cast<size_t>(t.row_capacity * t.cols), 0.0f);
  if (t.scaling == SFMOE_SCALING_NONE) {
    for (int64_t r = 0; r < t.row_capacity; ++r) {
      const int64_t source = row_index == nullptr ? r : row_index[r];
      if (source < 0 || (row_index != nullptr && source >= source_rows)) continue;
      for (int64_t c = 0; c < t.cols; ++c) {
        values[static_cast<size_t>(r * t.cols + c)] =
            load_value(t.rowwise, t.dtype, source * t.cols + c);
      }
    }
    return values;
  }
  grouped_dequantize(GroupedDequantizeArgs{t, o.columnwise, values.data(), SFMOE_DTYPE_FP32});
  return values;
}

}  // namespace

void grouped_gemm(const GroupedGemmArgs& g) {
  const std::vector<float> a = operand_values(g.a, g.a_row_index, g.a_source_rows),
                           b = operand_values(g.b);
  grouped_gemm_values(GroupedGemmValues{g.form, g.num_groups, g.offsets, g.n, g.k, a.data(),
                                        b.data(), g.out, g.out_dtype, g.accumulate});
}

}  // namespace cpu
}  // namespace sfmoe

// Grouped GEMM CPU reference (docs/grouped_gemm.md): the three forms on integer-valued operands
// (exact, against int64 arithmetic), on random operands (against float64, with the issue's
// 1 - 2 sum(xy) / sum(x^2 + y^2) measure), groups of 0, 1, 17, 33 and 64 rows, the wgrad
// accumulator, BF16 outputs, and the identity that ties the three forms together.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "sfmoe/grouped_gemm.h"
#include "sfmoe/numerics.h"
#include "src/cpu/backend.h"
#include "tests/cpp/host_descriptors.h"
#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace {

const std::vector<int64_t> kOffsets = {0, 0, 1, 18, 51, 115};  // groups of 0, 1, 17, 33, 64 rows
constexpr int64_t kGroups = 5, kRows = 115, kN = 24, kK = 40;

std::vector<float> run(GroupedGemmForm form, const std::vector<float>& a,
                       const std::vector<float>& b, std::vector<float> out,
                       bool accumulate = false) {
  cpu::grouped_gemm(GroupedGemmArgs{form, kGroups, kOffsets.data(), kN, kK, a.data(), b.data(),
                                    out.data(), SFMOE_DTYPE_FP32, accumulate});
  return out;
}

// The exact product over int64 (the operands are small integers).
int64_t exact(GroupedGemmForm form, const std::vector<float>& a, const std::vector<float>& b,
              int64_t group, int64_t i, int64_t j) {
  int64_t sum = 0;
  switch (form) {
    case GroupedGemmForm::kFprop:  // i = row, j = n
      for (int64_t r = 0; r < kK; ++r)
        sum += int64_t(a[i * kK + r]) * int64_t(b[(group * kN + j) * kK + r]);
      break;
    case GroupedGemmForm::kDgrad:  // i = row, j = k
      for (int64_t c = 0; c < kN; ++c)
        sum += int64_t(a[i * kN + c]) * int64_t(b[(group * kN + c) * kK + j]);
      break;
    case GroupedGemmForm::kWgrad:  // i = n, j = k
      for (int64_t m = kOffsets[group]; m < kOffsets[group + 1]; ++m)
        sum += int64_t(a[m * kN + i]) * int64_t(b[m * kK + j]);
      break;
  }
  return sum;
}

TEST(GroupedGemmCpu, IntegerOperandsAreExactInEveryForm) {
  std::mt19937_64 rng(testing::session_test_seed() + 30);
  std::uniform_int_distribution<int> small(-8, 8);
  auto integers = [&](size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = static_cast<float>(small(rng));
    return v;
  };
  const std::vector<float> x = integers(kRows * kK), w = integers(kGroups * kN * kK),
                           dy = integers(kRows * kN);
  const std::vector<float> y =
      run(GroupedGemmForm::kFprop, x, w, std::vector<float>(kRows * kN, NAN));
  const std::vector<float> dx =
      run(GroupedGemmForm::kDgrad, dy, w, std::vector<float>(kRows * kK, NAN));
  const std::vector<float> dw =
      run(GroupedGemmForm::kWgrad, dy, x, std::vector<float>(kGroups * kN * kK, NAN));
  for (int64_t g = 0; g < kGroups; ++g) {
    for (int64_t m = kOffsets[g]; m < kOffsets[g + 1]; ++m) {
      for (int64_t j = 0; j < kN; ++j)
        ASSERT_EQ(y[m * kN + j], exact(GroupedGemmForm::kFprop, x, w, g, m, j));
      for (int64_t r = 0; r < kK; ++r)
        ASSERT_EQ(dx[m * kK + r], exact(GroupedGemmForm::kDgrad, dy, w, g, m, r));
    }
    for (int64_t j = 0; j < kN; ++j) {
      for (int64_t r = 0; r < kK; ++r) {
        ASSERT_EQ(dw[(g * kN + j) * kK + r], exact(GroupedGemmForm::kWgrad, dy, x, g, j, r))
            << "group " << g;
      }
    }
  }
  // The forms are one bilinear map read three ways: sum(dY * Y) = sum(dX * X) = sum(dW * W).
  double via_y = 0, via_x = 0, via_w = 0;
  for (size_t i = 0; i < y.size(); ++i) via_y += double(dy[i]) * y[i];
  for (size_t i = 0; i < dx.size(); ++i) via_x += double(dx[i]) * x[i];
  for (size_t i = 0; i < dw.size(); ++i) via_w += double(dw[i]) * w[i];
  EXPECT_EQ(via_y, via_x);
  EXPECT_EQ(via_y, via_w);
}

TEST(GroupedGemmCpu, RandomOperandsAgainstFloat64) {
  std::mt19937_64 rng(testing::session_test_seed() + 31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto randoms = [&](size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const std::vector<float> x = randoms(kRows * kK), w = randoms(kGroups * kN * kK);
  const std::vector<float> y =
      run(GroupedGemmForm::kFprop, x, w, std::vector<float>(kRows * kN, NAN));
  double xy = 0, xx = 0;
  for (int64_t g = 0; g < kGroups; ++g) {
    for (int64_t m = kOffsets[g]; m < kOffsets[g + 1]; ++m) {
      for (int64_t j = 0; j < kN; ++j) {
        double want = 0;
        for (int64_t r = 0; r < kK; ++r) want += double(x[m * kK + r]) * w[(g * kN + j) * kK + r];
        xy += want * y[m * kN + j];
        xx += want * want + double(y[m * kN + j]) * y[m * kN + j];
      }
    }
  }
  const double mismatch = 1.0 - 2.0 * xy / xx;
  std::printf(
      "[ grouped gemm ] fprop fp32 reference vs float64: 1 - 2 sum(xy) / sum(x^2 + y^2) = %.3g\n",
      mismatch);
  EXPECT_LE(mismatch, 1e-12);
}

TEST(GroupedGemmCpu, WgradAccumulatorAndBf16Output) {
  std::mt19937_64 rng(testing::session_test_seed() + 32);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> dy(kRows * kN), x(kRows * kK), main_grad(kGroups * kN * kK);
  for (float& v : dy) v = normal(rng);
  for (float& v : x) v = normal(rng);
  for (float& v : main_grad) v = normal(rng);
  const std::vector<float> fresh =
      run(GroupedGemmForm::kWgrad, dy, x, std::vector<float>(main_grad.size(), NAN));
  const std::vector<float> accumulated = run(GroupedGemmForm::kWgrad, dy, x, main_grad, true);
  for (size_t i = 0; i < main_grad.size(); ++i) {
    const bool empty_group = static_cast<int64_t>(i) < kN * kK;  // group 0 has no rows
    ASSERT_EQ(fresh[i], empty_group ? 0.0f : fresh[i]) << "an empty group writes zeros";
    ASSERT_EQ(accumulated[i], numerics::add_rn(main_grad[i], fresh[i]))
        << "the accumulator adds the group's sum";
  }
  // BF16 output: the FP32 dot product rounded once.
  std::vector<float> w(kGroups * kN * kK);
  for (float& v : w) v = normal(rng);
  const std::vector<float> y32 =
      run(GroupedGemmForm::kFprop, x, w, std::vector<float>(kRows * kN, NAN));
  std::vector<uint16_t> y16(kRows * kN, 0xBEEF);
  cpu::grouped_gemm(GroupedGemmArgs{GroupedGemmForm::kFprop, kGroups, kOffsets.data(), kN, kK,
                                    x.data(), w.data(), y16.data(), SFMOE_DTYPE_BF16, false});
  for (size_t i = 0; i < y16.size(); ++i) ASSERT_EQ(y16[i], numerics::f32_to_bf16(y32[i]));
}

}  // namespace
}  // namespace sfmoe

namespace sfmoe {
namespace {

sfmoe_grouped_tensor weights(void* data, sfmoe_dtype dtype) {
  sfmoe_grouped_tensor t = testing::host_rows(data, dtype, kGroups, kGroups * kN, kK, 1, nullptr);
  t.uniform_group_rows = kN;
  return t;
}

TEST(GroupedGemmApi, ThreeFormsThroughTheCApiAndRefusals) {
  std::mt19937_64 rng(testing::session_test_seed() + 33);
  std::uniform_int_distribution<int> small(-4, 4);
  // BF16 operands holding small integers (exact in BF16), FP32 outputs.
  auto bf16_integers = [&](size_t count, std::vector<float>* as_f32) {
    std::vector<uint16_t> v(count);
    as_f32->resize(count);
    for (size_t i = 0; i < count; ++i) {
      (*as_f32)[i] = static_cast<float>(small(rng));
      v[i] = numerics::f32_to_bf16((*as_f32)[i]);
    }
    return v;
  };
  std::vector<float> xf, wf, dyf;
  std::vector<uint16_t> x = bf16_integers(kRows * kK, &xf),
                        w = bf16_integers(kGroups * kN * kK, &wf),
                        dy = bf16_integers(kRows * kN, &dyf);
  std::vector<int64_t> offsets(kOffsets), out_offsets(kGroups + 1, -1);
  std::vector<float> y(kRows * kN, NAN), dx(kRows * kK, NAN), dw(kGroups * kN * kK, NAN);
  sfmoe_grouped_tensor g_x =
      testing::host_rows(x.data(), SFMOE_DTYPE_BF16, kGroups, kRows, kK, 1, offsets.data());
  sfmoe_grouped_tensor g_dy =
      testing::host_rows(dy.data(), SFMOE_DTYPE_BF16, kGroups, kRows, kN, 1, offsets.data());
  sfmoe_grouped_tensor g_w = weights(w.data(), SFMOE_DTYPE_BF16);
  sfmoe_grouped_tensor g_y =
      testing::host_rows(y.data(), SFMOE_DTYPE_FP32, kGroups, kRows, kN, 1, out_offsets.data());
  sfmoe_grouped_tensor g_dx =
      testing::host_rows(dx.data(), SFMOE_DTYPE_FP32, kGroups, kRows, kK, 1, offsets.data());
  sfmoe_grouped_tensor g_dw = weights(dw.data(), SFMOE_DTYPE_FP32);
  sfmoe_grouped_gemm_config config = sfmoe_grouped_gemm_config_init();
  config.form = SFMOE_GEMM_FPROP;
  ASSERT_EQ(sfmoe_grouped_gemm(&g_x, &g_w, &config, &g_y, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(out_offsets, offsets) << "fprop's output receives the rows' offsets";
  config.form = SFMOE_GEMM_DGRAD;
  ASSERT_EQ(sfmoe_grouped_gemm(&g_dy, &g_w, &config, &g_dx, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  config.form = SFMOE_GEMM_WGRAD;
  ASSERT_EQ(sfmoe_grouped_gemm(&g_dy, &g_x, &config, &g_dw, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(y, run(GroupedGemmForm::kFprop, xf, wf, std::vector<float>(kRows * kN, NAN)));
  EXPECT_EQ(dx, run(GroupedGemmForm::kDgrad, dyf, wf, std::vector<float>(kRows * kK, NAN)));
  EXPECT_EQ(dw, run(GroupedGemmForm::kWgrad, dyf, xf, std::vector<float>(kGroups * kN * kK, NAN)));

  // Refusals write nothing.
  const std::vector<float> y_before = y;
  config.form = SFMOE_GEMM_FPROP;
  sfmoe_grouped_tensor quantized = g_w;
  quantized.dtype = SFMOE_DTYPE_FP8_E4M3;
  quantized.scaling = SFMOE_SCALING_TENSOR;
  quantized.rowwise_scale_inv = dw.data();
  EXPECT_EQ(sfmoe_grouped_gemm(&g_x, &quantized, &config, &g_y, nullptr), SFMOE_ERROR_UNSUPPORTED);
  sfmoe_grouped_tensor narrow = g_w;
  narrow.cols = kK - 8;
  EXPECT_EQ(sfmoe_grouped_gemm(&g_x, &narrow, &config, &g_y, nullptr), SFMOE_ERROR_SHAPE_MISMATCH);
  config.accumulate = 1;
  EXPECT_EQ(sfmoe_grouped_gemm(&g_x, &g_w, &config, &g_y, nullptr), SFMOE_ERROR_INVALID_ARGUMENT);
  config.accumulate = 0;
  offsets[3] = 0;  // below offsets[2] = 1: decreasing
  EXPECT_EQ(sfmoe_grouped_gemm(&g_x, &g_w, &config, &g_y, nullptr), SFMOE_ERROR_INVALID_ARGUMENT);
  offsets[3] = kOffsets[3];
  EXPECT_EQ(y, y_before);
}

}  // namespace
}  // namespace sfmoe

// Grouped GEMM CPU reference (docs/grouped_gemm.md): the three forms on integer-valued operands
// (exact, against int64 arithmetic), on random operands (against float64, with the issue's
// 1 - 2 sum(xy) / sum(x^2 + y^2) measure), groups of 0, 1, 17, 33 and 64 rows, the wgrad
// accumulator, BF16 outputs, and the identity that ties the three forms together.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sfmoe/grouped_gemm.h"
#include "sfmoe/numerics.h"
#include "sfmoe/quantize.h"
#include "src/cpu/backend.h"
#include "src/cuda/heuristics/gemm_tiles.h"
#include "tests/cpp/host_descriptors.h"
#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace {

const std::vector<int64_t> kOffsets = {0, 0, 1, 18, 51, 115};  // groups of 0, 1, 17, 33, 64 rows
constexpr int64_t kGroups = 5, kRows = 115, kN = 24, kK = 40;

std::vector<float> run(GroupedGemmForm form, const std::vector<float>& a,
                       const std::vector<float>& b, std::vector<float> out,
                       bool accumulate = false) {
  cpu::grouped_gemm_values(GroupedGemmValues{form, kGroups, kOffsets.data(), kN, kK, a.data(),
                                             b.data(), out.data(), SFMOE_DTYPE_FP32, accumulate});
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
  cpu::grouped_gemm_values(GroupedGemmValues{GroupedGemmForm::kFprop, kGroups, kOffsets.data(), kN,
                                             kK, x.data(), w.data(), y16.data(), SFMOE_DTYPE_BF16,
                                             false});
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
  ASSERT_EQ(sfmoe_grouped_gemm(&g_x, &g_w, &config, &g_y, nullptr, nullptr, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(out_offsets, offsets) << "fprop's output receives the rows' offsets";
  config.form = SFMOE_GEMM_DGRAD;
  ASSERT_EQ(sfmoe_grouped_gemm(&g_dy, &g_w, &config, &g_dx, nullptr, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  config.form = SFMOE_GEMM_WGRAD;
  ASSERT_EQ(sfmoe_grouped_gemm(&g_dy, &g_x, &config, &g_dw, nullptr, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(y, run(GroupedGemmForm::kFprop, xf, wf, std::vector<float>(kRows * kN, NAN)));
  EXPECT_EQ(dx, run(GroupedGemmForm::kDgrad, dyf, wf, std::vector<float>(kRows * kK, NAN)));
  EXPECT_EQ(dw, run(GroupedGemmForm::kWgrad, dyf, xf, std::vector<float>(kGroups * kN * kK, NAN)));

  // Refusals write nothing.
  const std::vector<float> y_before = y;
  config.form = SFMOE_GEMM_FPROP;
  sfmoe_grouped_tensor quantized_out = g_y;  // outputs are never quantized
  quantized_out.dtype = SFMOE_DTYPE_FP8_E4M3;
  quantized_out.scaling = SFMOE_SCALING_TENSOR;
  quantized_out.rowwise_scale_inv = dw.data();
  quantized_out.amax = dw.data();
  EXPECT_EQ(sfmoe_grouped_gemm(&g_x, &g_w, &config, &quantized_out, nullptr, nullptr, nullptr),
            SFMOE_ERROR_DTYPE_MISMATCH)
      << sfmoe_last_error();
  sfmoe_grouped_tensor narrow = g_w;
  narrow.cols = kK - 8;
  EXPECT_EQ(sfmoe_grouped_gemm(&g_x, &narrow, &config, &g_y, nullptr, nullptr, nullptr),
            SFMOE_ERROR_SHAPE_MISMATCH);
  config.accumulate = 1;
  EXPECT_EQ(sfmoe_grouped_gemm(&g_x, &g_w, &config, &g_y, nullptr, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  config.accumulate = 0;
  offsets[3] = 0;  // below offsets[2] = 1: decreasing
  EXPECT_EQ(sfmoe_grouped_gemm(&g_x, &g_w, &config, &g_y, nullptr, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  offsets[3] = kOffsets[3];
  EXPECT_EQ(y, y_before);
}

// fprop and dgrad with A's rows gathered (config.a_row_index) equal the same calls on the rows
// copied out: repeated sources, padding rows (-1) and indices past the source read as zero rows;
// wgrad, quantized rows and a negative source count are refused, writing nothing.
// wgrad over operands of no rows at all (row_capacity 0, every group empty): zeros, or the
// accumulator unchanged; nothing is read (UBSan in CI would name pointer arithmetic on the empty
// operands' NULL data).
TEST(GroupedGemmApi, WgradOverNoRowsWritesZerosOrLeavesTheAccumulator) {
  std::vector<int64_t> offsets(kGroups + 1, 0);
  uint16_t none[8] = {};  // (a descriptor's data is set even where it holds no row)
  sfmoe_grouped_tensor g_dy =
      testing::host_rows(none, SFMOE_DTYPE_BF16, kGroups, 0, kN, 1, offsets.data());
  sfmoe_grouped_tensor g_x =
      testing::host_rows(none, SFMOE_DTYPE_BF16, kGroups, 0, kK, 1, offsets.data());
  sfmoe_grouped_gemm_config config = sfmoe_grouped_gemm_config_init();
  config.form = SFMOE_GEMM_WGRAD;
  std::vector<float> dw(kGroups * kN * kK, NAN);
  sfmoe_grouped_tensor g_dw = weights(dw.data(), SFMOE_DTYPE_FP32);
  ASSERT_EQ(sfmoe_grouped_gemm(&g_dy, &g_x, &config, &g_dw, nullptr, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_TRUE(std::all_of(dw.begin(), dw.end(), [](float v) { return v == 0.0f; }));
  std::vector<float> main_grad(dw.size(), 1.5f);
  sfmoe_grouped_tensor g_main = weights(main_grad.data(), SFMOE_DTYPE_FP32);
  config.accumulate = 1;
  ASSERT_EQ(sfmoe_grouped_gemm(&g_dy, &g_x, &config, &g_main, nullptr, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_TRUE(std::all_of(main_grad.begin(), main_grad.end(), [](float v) { return v == 1.5f; }));
}

TEST(GroupedGemmApi, GatheredRowsEqualTheRowsCopiedOut) {
  std::mt19937_64 rng(testing::session_test_seed() + 34);
  std::uniform_int_distribution<int> small(-4, 4);
  constexpr int64_t kSources = 37;
  for (const bool fprop : {true, false}) {
    const int64_t cols = fprop ? kK : kN, out_cols = fprop ? kN : kK;
    std::vector<uint16_t> source(kSources * cols), w(kGroups * kN * kK);
    for (auto& v : source) v = numerics::f32_to_bf16(static_cast<float>(small(rng)));
    for (auto& v : w) v = numerics::f32_to_bf16(static_cast<float>(small(rng)));
    std::uniform_int_distribution<int32_t> pick(-3, kSources + 2);  // some outside the source
    std::vector<int32_t> index(kRows);
    std::vector<uint16_t> copied(kRows * cols, 0);  // bf16 zeros
    for (int64_t r = 0; r < kRows; ++r) {
      index[r] = pick(rng);
      if (index[r] < 0 || index[r] >= kSources) continue;
      for (int64_t c = 0; c < cols; ++c) copied[r * cols + c] = source[index[r] * cols + c];
    }
    std::vector<int64_t> offsets(kOffsets);
    std::vector<float> gathered_out(kRows * out_cols, NAN), copied_out(kRows * out_cols, NAN);
    sfmoe_grouped_tensor g_w = weights(w.data(), SFMOE_DTYPE_BF16);
    sfmoe_grouped_tensor g_source = testing::host_rows(source.data(), SFMOE_DTYPE_BF16, kGroups,
                                                       kRows, cols, 1, offsets.data());
    sfmoe_grouped_tensor g_copied = testing::host_rows(copied.data(), SFMOE_DTYPE_BF16, kGroups,
                                                       kRows, cols, 1, offsets.data());
    sfmoe_grouped_tensor g_gathered_out = testing::host_rows(
        gathered_out.data(), SFMOE_DTYPE_FP32, kGroups, kRows, out_cols, 1, offsets.data());
    sfmoe_grouped_tensor g_copied_out = testing::host_rows(
        copied_out.data(), SFMOE_DTYPE_FP32, kGroups, kRows, out_cols, 1, offsets.data());
    sfmoe_grouped_gemm_config config = sfmoe_grouped_gemm_config_init();
    config.form = fprop ? SFMOE_GEMM_FPROP : SFMOE_GEMM_DGRAD;
    ASSERT_EQ(
        sfmoe_grouped_gemm(&g_copied, &g_w, &config, &g_copied_out, nullptr, nullptr, nullptr),
        SFMOE_SUCCESS)
        << sfmoe_last_error();
    config.a_row_index = index.data();
    config.a_source_rows = kSources;
    ASSERT_EQ(
        sfmoe_grouped_gemm(&g_source, &g_w, &config, &g_gathered_out, nullptr, nullptr, nullptr),
        SFMOE_SUCCESS)
        << sfmoe_last_error();
    EXPECT_EQ(gathered_out, copied_out) << (fprop ? "fprop" : "dgrad");
    EXPECT_FALSE(std::isnan(gathered_out[0]));

    // Refusals write nothing.
    const std::vector<float> before = gathered_out;
    config.a_source_rows = -1;
    EXPECT_EQ(
        sfmoe_grouped_gemm(&g_source, &g_w, &config, &g_gathered_out, nullptr, nullptr, nullptr),
        SFMOE_ERROR_INVALID_ARGUMENT);
    config.a_source_rows = kSources;
    config.form = SFMOE_GEMM_WGRAD;
    std::vector<float> dw(kGroups * kN * kK, NAN);
    sfmoe_grouped_tensor g_dw = weights(dw.data(), SFMOE_DTYPE_FP32);
    EXPECT_EQ(sfmoe_grouped_gemm(&g_source, &g_source, &config, &g_dw, nullptr, nullptr, nullptr),
              SFMOE_ERROR_UNSUPPORTED)
        << "wgrad gathers nothing";
    EXPECT_TRUE(std::isnan(dw[0]));
    EXPECT_EQ(gathered_out, before);
  }
}

}  // namespace
}  // namespace sfmoe

namespace sfmoe {
namespace {

// A host grouped tensor quantized as FP8 1x128 blockwise (E4M3, FP32 scales) with both copies,
// from BF16 values. Blockwise scales are not powers of two, so the two copies round differently
// and a GEMM that read the wrong copy would show (MXFP8's power-of-two scales round the same
// values the same way in both directions, apart from E4M3 subnormals).
struct QuantizedHost {
  std::vector<uint16_t> source;
  std::vector<uint8_t> rowwise, columnwise;
  std::vector<float> rowwise_scales, columnwise_scales;
  std::vector<int64_t> offsets;
  sfmoe_grouped_tensor q;
};

void quantize_blockwise(QuantizedHost* h, int64_t groups, int64_t rows, int64_t cols,
                        const int64_t* in_offsets, int64_t uniform_rows) {
  // Input groups already aligned to 128 rows: the quantized output needs no extra capacity.
  sfmoe_grouped_tensor in = testing::host_rows(h->source.data(), SFMOE_DTYPE_BF16, groups, rows,
                                               cols, 128, const_cast<int64_t*>(in_offsets));
  in.uniform_group_rows = uniform_rows;
  h->rowwise.assign(rows * cols, 0);
  h->columnwise.assign(rows * cols, 0);
  h->rowwise_scales.assign(rows * cols / 128, 0.0f);
  h->columnwise_scales.assign(rows * cols / 128, 0.0f);
  h->offsets.assign(groups + 1, 0);
  h->q = sfmoe_grouped_tensor_init();
  h->q.memory = SFMOE_MEMORY_HOST;
  h->q.dtype = SFMOE_DTYPE_FP8_E4M3;
  h->q.scaling = SFMOE_SCALING_BLOCK_1X128;
  h->q.num_groups = groups;
  h->q.row_capacity = rows;
  h->q.cols = cols;
  h->q.row_alignment = 128;
  h->q.uniform_group_rows = uniform_rows;
  h->q.group_offsets = uniform_rows ? nullptr : h->offsets.data();
  h->q.rowwise_data = h->rowwise.data();
  h->q.rowwise_scale_inv = h->rowwise_scales.data();
  h->q.columnwise_data = h->columnwise.data();
  h->q.columnwise_scale_inv = h->columnwise_scales.data();
  const sfmoe_quantize_config config = sfmoe_quantize_config_init();
  ASSERT_EQ(sfmoe_grouped_quantize(&in, &h->q, &config, nullptr, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
}

std::vector<float> dequantized(const QuantizedHost& h, sfmoe_dequantize_source source) {
  std::vector<float> v(h.q.row_capacity * h.q.cols, 0.0f);
  sfmoe_grouped_tensor out = h.q;
  out.dtype = SFMOE_DTYPE_FP32;
  out.scaling = SFMOE_SCALING_NONE;
  out.rowwise_data = v.data();
  out.rowwise_scale_inv = out.columnwise_data = out.columnwise_scale_inv = nullptr;
  EXPECT_EQ(sfmoe_grouped_dequantize(&h.q, &out, source, nullptr, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  return v;
}

TEST(GroupedGemmApi, QuantizedOperandsReadTheCopyOfTheirForm) {
  const int64_t groups = 3, rows = 256, n = 128, k = 128;
  const std::vector<int64_t> offsets = {0, 128, 128, 256};
  std::mt19937_64 rng(testing::session_test_seed() + 34);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  QuantizedHost x, w, dy;
  x.source.resize(rows * k);
  w.source.resize(groups * n * k);
  dy.source.resize(rows * n);
  for (auto* h : {&x, &w, &dy}) {
    for (uint16_t& v : h->source) v = numerics::f32_to_bf16(normal(rng));
  }
  quantize_blockwise(&x, groups, rows, k, offsets.data(), 0);
  quantize_blockwise(&w, groups, groups * n, k, nullptr, n);
  quantize_blockwise(&dy, groups, rows, n, offsets.data(), 0);
  ASSERT_EQ(x.offsets, offsets);
  ASSERT_NE(dequantized(w, SFMOE_DEQUANTIZE_ROWWISE), dequantized(w, SFMOE_DEQUANTIZE_COLUMNWISE))
      << "the test needs copies that round differently";

  struct Case {
    sfmoe_gemm_form form;
    GroupedGemmForm ref_form;
    const QuantizedHost *a, *b;
    sfmoe_dequantize_source a_copy, b_copy;
    int64_t out_rows, out_cols;
  };
  const Case cases[] = {
      {SFMOE_GEMM_FPROP, GroupedGemmForm::kFprop, &x, &w, SFMOE_DEQUANTIZE_ROWWISE,
       SFMOE_DEQUANTIZE_ROWWISE, rows, n},
      {SFMOE_GEMM_DGRAD, GroupedGemmForm::kDgrad, &dy, &w, SFMOE_DEQUANTIZE_ROWWISE,
       SFMOE_DEQUANTIZE_COLUMNWISE, rows, k},
      {SFMOE_GEMM_WGRAD, GroupedGemmForm::kWgrad, &dy, &x, SFMOE_DEQUANTIZE_COLUMNWISE,
       SFMOE_DEQUANTIZE_COLUMNWISE, groups * n, k},
  };
  for (const Case& c : cases) {
    std::vector<float> got(c.out_rows * c.out_cols, 0.0f), want(c.out_rows * c.out_cols, 0.0f);
    std::vector<int64_t> out_offsets(offsets);
    sfmoe_grouped_tensor out = testing::host_rows(got.data(), SFMOE_DTYPE_FP32, groups, c.out_rows,
                                                  c.out_cols, 1, out_offsets.data());
    if (c.form == SFMOE_GEMM_WGRAD) {
      out.group_offsets = nullptr;
      out.uniform_group_rows = n;
    }
    sfmoe_grouped_gemm_config config = sfmoe_grouped_gemm_config_init();
    config.form = c.form;
    ASSERT_EQ(sfmoe_grouped_gemm(&c.a->q, &c.b->q, &config, &out, nullptr, nullptr, nullptr),
              SFMOE_SUCCESS)
        << sfmoe_last_error();
    const std::vector<float> av = dequantized(*c.a, c.a_copy), bv = dequantized(*c.b, c.b_copy);
    cpu::grouped_gemm_values(GroupedGemmValues{c.ref_form, groups, offsets.data(), n, k, av.data(),
                                               bv.data(), want.data(), SFMOE_DTYPE_FP32, false});
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (numerics::f32_to_bits(got[i]) != numerics::f32_to_bits(want[i]) && differ++ == 0)
        first = i;
    }
    EXPECT_EQ(differ, 0u) << "form " << c.form << ": first at " << first << ": " << got[first]
                          << " vs " << want[first];
  }
  // The copy a form reads must be present.
  sfmoe_grouped_tensor rowwise_only = x.q;
  rowwise_only.columnwise_data = nullptr;
  rowwise_only.columnwise_scale_inv = nullptr;
  std::vector<float> dw(groups * n * k);
  sfmoe_grouped_tensor out =
      testing::host_rows(dw.data(), SFMOE_DTYPE_FP32, groups, groups * n, k, 1, nullptr);
  out.uniform_group_rows = n;
  sfmoe_grouped_gemm_config config = sfmoe_grouped_gemm_config_init();
  config.form = SFMOE_GEMM_WGRAD;
  EXPECT_EQ(sfmoe_grouped_gemm(&dy.q, &rowwise_only, &config, &out, nullptr, nullptr, nullptr),
            SFMOE_ERROR_NULL_POINTER);
}

// The workspace a call needs: the kernels' part alone unless both operands are emulated
// (MXFP8 / NVFP4), then room for their BF16 copies as well; -1 for negative or overflowing sizes.
TEST(GroupedGemmApi, WorkspaceSizePerCall) {
  const int64_t base =
      testing::gemm_workspace_words(8, SFMOE_SCALING_NONE, 0, 0, SFMOE_SCALING_NONE, 0, 0);
  EXPECT_EQ(
      testing::gemm_workspace_words(8, SFMOE_SCALING_NONE, 256, 64, SFMOE_SCALING_NONE, 512, 64),
      base);
  EXPECT_EQ(testing::gemm_workspace_words(8, SFMOE_SCALING_MX_1X32, 256, 64, SFMOE_SCALING_TENSOR,
                                          512, 64),
            base);  // a pairing the device does not emulate
  const int64_t emulated = testing::gemm_workspace_words(8, SFMOE_SCALING_MX_1X32, 256, 64,
                                                         SFMOE_SCALING_NV_16X16, 512, 64);
  if (base > 0) {  // a build and machine with the device GEMM
    EXPECT_GE(emulated * 8, base * 8 + (256 + 512) * 64 * 2);
  } else {
    EXPECT_EQ(emulated, 0);
  }
  EXPECT_EQ(testing::gemm_workspace_words(-1, SFMOE_SCALING_NONE, 1, 1, SFMOE_SCALING_NONE, 1, 1),
            -1);
  EXPECT_EQ(testing::gemm_workspace_words(1, SFMOE_SCALING_MX_1X32, INT64_MAX / 4, 32,
                                          SFMOE_SCALING_MX_1X32, 1, 32),
            -1);
}

}  // namespace
}  // namespace sfmoe

// The tile heuristic (src/cuda/heuristics/gemm_tiles.h, host code): the choices its comment states
// for the measured shape families, and the names SFMOE_GEMM_TILE takes.

namespace sfmoe {
namespace {

TEST(GroupedGemmHeuristics, ShapeFamiliesGetTheMeasuredTiles) {
  using cuda::choose_gemm_tile;
  using cuda::choose_gemm_tile_for;
  using cuda::GemmRecipe;
  using cuda::GemmTile;
  // BF16 and accurate FP8: by rows per group (decode-sized groups take the 64-row ping-pong).
  EXPECT_EQ(choose_gemm_tile(GemmRecipe::kBf16, 64, 4096, 7168), GemmTile::kPingpong64x128);
  EXPECT_EQ(choose_gemm_tile(GemmRecipe::kBf16, 512, 1536, 2048), GemmTile::kCooperative128x256);
  EXPECT_EQ(choose_gemm_tile(GemmRecipe::kFp8Tensor, 64, 4096, 7168), GemmTile::kPingpong64x128);
  EXPECT_EQ(choose_gemm_tile(GemmRecipe::kFp8Tensor, 1024, 4096, 7168),
            GemmTile::kCooperative128x128);
  EXPECT_EQ(choose_gemm_tile(GemmRecipe::kFp8Blockwise, 1024, 4096, 7168),
            GemmTile::kCooperative128x128);
  // FP8 fast accumulation: ping-pong 128x128 for K <= 4096 with N >= 2048, else 128x256.
  struct Case {
    const char* name;
    int64_t n, k;
    GemmTile tile;
  };
  for (const Case& c : {Case{"DeepSeek-V3 fc1", 4096, 7168, GemmTile::kCooperative128x256},
                        Case{"DeepSeek-V3 fc2", 7168, 2048, GemmTile::kPingpong128x128},
                        Case{"Qwen3 fc1", 1536, 2048, GemmTile::kCooperative128x256},
                        Case{"Qwen3 fc2", 2048, 768, GemmTile::kPingpong128x128},
                        Case{"Mixtral fc1", 28672, 4096, GemmTile::kPingpong128x128},
                        Case{"Mixtral fc2", 4096, 14336, GemmTile::kCooperative128x256}}) {
    EXPECT_EQ(choose_gemm_tile(GemmRecipe::kFp8TensorFast, 1024, c.n, c.k), c.tile) << c.name;
  }
  // Each form's GEMM shape (DeepSeek-V3 EP8 fc2's weights: n 7168, k 2048; 32 groups of 1024
  // rows): fprop N 7168, K 2048; dgrad N 2048, K 7168; wgrad M 7168, N 2048, K 1024.
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kFprop, GemmRecipe::kFp8TensorFast, 32768, 32,
                                 7168, 2048),
            GemmTile::kPingpong128x128);
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kDgrad, GemmRecipe::kFp8TensorFast, 32768, 32,
                                 7168, 2048),
            GemmTile::kCooperative128x256);
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kFp8TensorFast, 32768, 32,
                                 7168, 2048),
            GemmTile::kPingpong128x128);
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kFp8TensorFast, 32768, 32,
                                 1536, 7168),  // N 7168, K 1024: ping-pong
            GemmTile::kPingpong128x128);
  // BF16: M is the rows per group in fprop and dgrad, n in wgrad; fprop and dgrad run sfmoe's own
  // kernel where CUTLASS's 128 x 256 would, wgrad the own wgrad kernel there up to 1024 rows per
  // group (CUTLASS's 128 x 256 stays the fallback for the calls the own kernels do not take).
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kDgrad, GemmRecipe::kBf16, 4096, 64, 7168, 2048),
            GemmTile::kPingpong64x128);
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kFprop, GemmRecipe::kBf16, 65536, 128, 1536, 2048),
      GemmTile::kContiguous128x256Cluster2);
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kDgrad, GemmRecipe::kBf16, 65536, 128, 1536, 2048),
      GemmTile::kContiguous128x256Cluster2);
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kBf16, 65536, 128, 1536, 2048),
      GemmTile::kWgrad128x256);
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kBf16, 4096, 64, 7168, 2048),
            GemmTile::kWgrad128x256);
  EXPECT_EQ(cuda::choose_cutlass_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kBf16, 65536, 128,
                                          1536, 2048),
            GemmTile::kCooperative128x256);
  EXPECT_EQ(cuda::choose_cutlass_tile_for(GroupedGemmForm::kFprop, GemmRecipe::kBf16, 65536, 128,
                                          1536, 2048),
            GemmTile::kCooperative128x256);
  // BF16 fprop and dgrad: 192 wide where it covers the GEMM's N (n in fprop, k in dgrad) with
  // fewer columns than 256 (gpt-oss's 2880 and 5760), 256 where both cover it alike or 256 less.
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kFprop, GemmRecipe::kBf16, 32768, 128, 2880, 2880),
      GemmTile::kContiguous128x192Cluster2);
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kFprop, GemmRecipe::kBf16, 32768, 128, 5760, 2880),
      GemmTile::kContiguous128x192Cluster2);
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kDgrad, GemmRecipe::kBf16, 32768, 128, 5760, 2880),
      GemmTile::kContiguous128x192Cluster2);
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kDgrad, GemmRecipe::kBf16, 65536, 128, 2048, 768),
            GemmTile::kContiguous128x256Cluster2);  // N 768: three 256 tiles, four of 192
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kDgrad, GemmRecipe::kBf16, 49152, 64, 2048, 1408),
            GemmTile::kContiguous128x256Cluster2);  // N 1408: 1536 columns either way
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kFprop, GemmRecipe::kBf16, 65536, 128, 960, 64),
            GemmTile::kContiguous128x192Cluster2);  // N 960: 960 against 1024
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kBf16, 32768, 128, 2880, 2880),
      GemmTile::kWgrad128x256);  // wgrad: the own wgrad kernel's single width
  // The own kernel in 2-CTA clusters from 128 rows per group, CUTLASS's 64 x 128 below.
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kFprop, GemmRecipe::kBf16, 32768, 32, 4096, 7168),
            GemmTile::kContiguous128x256Cluster2);
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kDgrad, GemmRecipe::kBf16, 16384, 128, 4096, 7168),
      GemmTile::kContiguous128x256Cluster2);  // 128 rows per group
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kFprop, GemmRecipe::kBf16, 16383, 128, 4096, 7168),
      GemmTile::kPingpong64x128);  // 127 rows per group
  // BF16 wgrad, the measured shapes (n, k; rows per group): ping-pong for DeepSeek-V3 fc1's short
  // reduction into a wide output, the own wgrad kernel for Qwen3 (512 rows), CUTLASS's 128 x 256
  // for Mixtral (2048 rows), 64 x 128 where n is below 128.
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kBf16, 32768, 32, 4096, 7168),
            GemmTile::kPingpong128x128);
  EXPECT_EQ(
      choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kBf16, 65536, 128, 1536, 2048),
      GemmTile::kWgrad128x256);
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kBf16, 32768, 32, 7168, 2048),
            GemmTile::kWgrad128x256);  // DeepSeek-V3 fc2: 1024 rows per group
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kBf16, 16384, 8, 28672, 4096),
            GemmTile::kCooperative128x256);
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kWgrad, GemmRecipe::kBf16, 65536, 8, 64, 2048),
            GemmTile::kPingpong64x128);
  // The override's names, and an unknown one (which leaves the heuristic's choice).
  EXPECT_EQ(cuda::gemm_tile_named("coop128"), GemmTile::kCooperative128x128);
  EXPECT_EQ(cuda::gemm_tile_named("coop256"), GemmTile::kCooperative128x256);
  EXPECT_EQ(cuda::gemm_tile_named("pingpong64"), GemmTile::kPingpong64x128);
  EXPECT_EQ(cuda::gemm_tile_named("coop256x128"), GemmTile::kCooperative256x128);
  EXPECT_EQ(cuda::gemm_tile_named("pingpong128"), GemmTile::kPingpong128x128);
  EXPECT_EQ(cuda::gemm_tile_named("contig256"), GemmTile::kContiguous128x256);
  EXPECT_EQ(cuda::gemm_tile_named("contig192"), GemmTile::kContiguous128x192);
  EXPECT_EQ(cuda::gemm_tile_named("contig128"), GemmTile::kContiguous128x128);
  EXPECT_EQ(cuda::gemm_tile_named("contig256c2"), GemmTile::kContiguous128x256Cluster2);
  EXPECT_EQ(cuda::gemm_tile_named("contig192c2"), GemmTile::kContiguous128x192Cluster2);
  EXPECT_EQ(cuda::gemm_tile_named("wgrad256"), GemmTile::kWgrad128x256);
  EXPECT_EQ(cuda::gemm_tile_named("wgrad256c2"), GemmTile::kWgrad128x256Cluster2);
  EXPECT_EQ(cuda::gemm_tile_named("wgrad192"), GemmTile::kWgrad128x192);
  EXPECT_EQ(cuda::gemm_tile_named("blockwise128"), GemmTile::kBlockwiseContiguous128x128);
  EXPECT_EQ(cuda::gemm_tile_named("blockwise128c2"), GemmTile::kBlockwiseContiguous128x128Cluster2);
  // (the own kernels' tiles are told apart: a blockwise tile is no BF16 contiguous one)
  EXPECT_TRUE(cuda::is_blockwise_contiguous_tile(GemmTile::kBlockwiseContiguous128x128Cluster2));
  EXPECT_FALSE(cuda::is_contiguous_tile(GemmTile::kBlockwiseContiguous128x128));
  EXPECT_FALSE(cuda::is_blockwise_contiguous_tile(GemmTile::kContiguous128x128));
  // FP8 blockwise keeps CUTLASS's 128 x 128 by default (the own kernel is chosen by name only).
  EXPECT_EQ(choose_gemm_tile_for(GroupedGemmForm::kFprop, GemmRecipe::kFp8Blockwise, 65536, 128,
                                 1536, 2048),
            GemmTile::kCooperative128x128);
  EXPECT_FALSE(cuda::gemm_tile_named("no-such-tile").has_value());
  EXPECT_FALSE(cuda::gemm_tile_named(nullptr).has_value());
}

}  // namespace
}  // namespace sfmoe

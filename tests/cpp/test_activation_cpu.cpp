// Grouped activations, CPU reference (docs/activations.md): known values, the
// backward of every kind against float64 central differences, and the grouped layout (real rows
// computed bit for bit by the per-element rule, padding rows zero, nothing beyond the groups
// written), with special values in the inputs. Fresh random inputs each run (seed printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "sfmoe/activation.h"
#include "sfmoe/numerics.h"
#include "src/cpu/activation_math.h"
#include "src/cpu/backend.h"
#include "tests/cpp/host_descriptors.h"
#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace {

using cpu::Activation;

const ActivationKind kKinds[] = {ActivationKind::kSwiGLU,      ActivationKind::kGeGLU,
                                 ActivationKind::kSiLU,        ActivationKind::kGeLU,
                                 ActivationKind::kSquaredReLU, ActivationKind::kClampedSwiGLU};
const char* const kNames[] = {"swiglu", "geglu", "silu", "gelu", "squared_relu", "clamped_swiglu"};

ActivationConfig config_of(ActivationKind kind) {
  ActivationConfig c;
  c.kind = kind;
  return c;
}

TEST(ActivationCpu, KnownValuesAndZeroPreservation) {
  for (ActivationKind kind : kKinds) {
    EXPECT_EQ(Activation<float>::forward(config_of(kind), 0.0f, 0.0f), 0.0f)
        << "padding zeros stay zero";
  }
  EXPECT_NEAR(Activation<float>::forward(config_of(ActivationKind::kSwiGLU), 1.0f, 2.0f),
              2.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(Activation<float>::forward(config_of(ActivationKind::kGeLU), 1.0f, 0.0f),
              0.8411920071, 1e-6);
  EXPECT_EQ(Activation<float>::forward(config_of(ActivationKind::kSquaredReLU), 3.0f, 0.0f), 9.0f);
  EXPECT_EQ(Activation<float>::forward(config_of(ActivationKind::kSquaredReLU), -3.0f, 0.0f), 0.0f);
  // NaN propagates through every kind (divergence must show).
  for (ActivationKind kind : kKinds) {
    EXPECT_TRUE(std::isnan(Activation<float>::forward(config_of(kind), NAN, 1.0f)))
        << static_cast<int>(kind);
  }
  // GELU's gradient at huge inputs: the saturated limits, not 0 * Inf.
  EXPECT_EQ(Activation<float>::gelu_grad(1e20f, Activation<float>::gelu_sigmoid(1e20f)), 1.0f);
  EXPECT_EQ(Activation<float>::gelu_grad(-1e20f, Activation<float>::gelu_sigmoid(-1e20f)), 0.0f);
  // Clamped SwiGLU (limit 7, alpha 1.702): gate 10 -> 7, up -10 -> -7.
  const double s = 1.0 / (1.0 + std::exp(-1.702 * 7.0));
  EXPECT_NEAR(Activation<float>::forward(config_of(ActivationKind::kClampedSwiGLU), 10.0f, -10.0f),
              7.0 * s * -6.0, 1e-5);
}

TEST(ActivationCpu, BackwardMatchesFloat64FiniteDifferences) {
  std::mt19937_64 rng(testing::session_test_seed() + 20);
  std::uniform_real_distribution<float> value(-8.0f, 8.0f), grad(-2.0f, 2.0f);
  for (size_t k = 0; k < 6; ++k) {
    const ActivationConfig c = config_of(kKinds[k]);
    double worst = 0.0;
    int checked = 0;
    while (checked < 2000) {
      const float g = value(rng), u = value(rng), d = grad(rng);
      // Stay off the kinks (ReLU at 0, the clamps at +-limit) by more than the step.
      if (std::fabs(g) < 1e-3f || std::fabs(std::fabs(g) - c.limit) < 1e-3f ||
          std::fabs(std::fabs(u) - c.limit) < 1e-3f)
        continue;
      float dg = 0, du = 0;
      Activation<float>::backward(c, g, u, d, &dg, &du);
      const double h = 1e-6;
      const double fd_g =
          d *
          (Activation<double>::forward(c, g + h, u) - Activation<double>::forward(c, g - h, u)) /
          (2 * h);
      const double fd_u =
          d *
          (Activation<double>::forward(c, g, u + h) - Activation<double>::forward(c, g, u - h)) /
          (2 * h);
      // An absolute floor for gradients near a zero of the derivative (e.g. the minimum of
      // g sigmoid(alpha g) at g ~ -0.75), where two terms of ~0.2 cancel in FP32: scaled by the
      // operands, far below any gradient that is not nearly zero.
      const double floor = 1e-5 * std::fabs(d) * (1.0 + std::fabs(u));
      const double err_g = std::fabs(dg - fd_g) / (floor + std::fabs(fd_g));
      const double err_u = std::fabs(du - fd_u) / (floor + std::fabs(fd_u));
      worst = std::max(worst, std::max(err_g, err_u));
      ASSERT_LE(err_g, 1e-3) << kNames[k] << " d gate at (" << g << ", " << u << "): " << dg
                             << " vs " << fd_g;
      ASSERT_LE(err_u, 1e-3) << kNames[k] << " d up at (" << g << ", " << u << "): " << du << " vs "
                             << fd_u;
      ++checked;
    }
    std::printf("[ activation ] %-15s 2000 points, worst |d - fd| / (floor + |fd|) = %.2e\n",
                kNames[k], worst);
  }
}

TEST(ActivationCpu, GroupedRowsPaddingAndSpecials) {
  std::mt19937_64 rng(testing::session_test_seed() + 21);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t cols = 24, row_capacity = 300;
  // Groups: padded blocks of 32 rows holding 0, 1, 31, 33 (two blocks) and 17 real rows.
  const std::vector<int64_t> offsets = {0, 0, 32, 64, 128, 160};
  const std::vector<int64_t> rows = {0, 1, 31, 33, 17};
  const GroupRowsView groups{offsets.data(), rows.data(), 5};
  const uint16_t specials[] = {0x7FC0, 0xFF80,          0x7F80, 0x8000,
                               0x0001, 0x4120 /* 10 */, 0xC120 /* -10 */};
  for (size_t k = 0; k < 6; ++k) {
    const ActivationConfig c = config_of(kKinds[k]);
    const bool gated = activation_is_gated(c.kind);
    const int64_t in_cols = gated ? 2 * cols : cols;
    std::vector<uint16_t> input(row_capacity * in_cols), output(row_capacity * cols, 0xBEEF);
    for (size_t i = 0; i < input.size(); ++i) {
      input[i] = i % 41 == 0 ? specials[(i / 41) % 7] : numerics::f32_to_bf16(normal(rng));
    }
    cpu::activation_forward(ActivationArgs{c, groups, cols, input.data(), SFMOE_DTYPE_BF16,
                                           output.data(), SFMOE_DTYPE_BF16, nullptr, nullptr});
    std::vector<float> d_out(row_capacity * cols), d_in(row_capacity * in_cols, 1234.0f);
    for (float& v : d_out) v = normal(rng);
    cpu::activation_backward(ActivationBackwardArgs{c, groups, cols, input.data(), SFMOE_DTYPE_BF16,
                                                    d_out.data(), SFMOE_DTYPE_FP32, d_in.data(),
                                                    SFMOE_DTYPE_FP32});
    for (int64_t r = 0; r < row_capacity; ++r) {
      int64_t g = -1;
      for (int64_t q = 0; q < 5; ++q) {
        if (r >= offsets[q] && r < offsets[q + 1]) g = q;
      }
      const bool real = g >= 0 && r < offsets[g] + rows[g];
      for (int64_t j = 0; j < cols; ++j) {
        const uint16_t got = output[r * cols + j];
        if (g < 0) {
          ASSERT_EQ(got, 0xBEEF) << kNames[k] << " row " << r << " is beyond the groups";
          ASSERT_EQ(d_in[r * in_cols + j], 1234.0f);
          continue;
        }
        if (!real) {
          ASSERT_EQ(got, 0) << kNames[k] << " padding row " << r;
          ASSERT_EQ(d_in[r * in_cols + j], 0.0f);
          continue;
        }
        const float gv = numerics::bf16_to_f32(input[r * in_cols + j]);
        const float uv = gated ? numerics::bf16_to_f32(input[r * in_cols + cols + j]) : 0.0f;
        ASSERT_EQ(got, numerics::f32_to_bf16(Activation<float>::forward(c, gv, uv)))
            << kNames[k] << " row " << r;
        float dg = 0, du = 0;
        Activation<float>::backward(c, gv, uv, d_out[r * cols + j], &dg, &du);
        ASSERT_EQ(numerics::f32_to_bits(d_in[r * in_cols + j]), numerics::f32_to_bits(dg));
        if (gated) {
          ASSERT_EQ(numerics::f32_to_bits(d_in[r * in_cols + cols + j]), numerics::f32_to_bits(du));
        }
      }
    }
  }
}

}  // namespace
}  // namespace sfmoe

namespace sfmoe {
namespace {

TEST(ActivationApi, ThroughTheCApiAndItsRefusals) {
  const int64_t cols = 8, capacity = 96, groups = 3;
  std::vector<int64_t> offsets = {0, 32, 32, 64}, out_offsets(groups + 1, -1), rows = {20, 0, 31};
  std::mt19937_64 rng(testing::session_test_seed() + 22);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<uint16_t> input(capacity * 2 * cols), output(capacity * cols, 0xBEEF);
  for (uint16_t& v : input) v = numerics::f32_to_bf16(normal(rng));
  auto grouped = [&](void* data, sfmoe_dtype dtype, int64_t c, int64_t* offs) {
    return testing::host_rows(data, dtype, groups, capacity, c, 1, offs);
  };
  sfmoe_grouped_tensor g_in = grouped(input.data(), SFMOE_DTYPE_BF16, 2 * cols, offsets.data());
  sfmoe_grouped_tensor g_out = grouped(output.data(), SFMOE_DTYPE_BF16, cols, out_offsets.data());
  sfmoe_tensor t_rows = testing::host_tensor(rows.data(), SFMOE_DTYPE_INT64, {groups});
  sfmoe_activation_config config = sfmoe_activation_config_init();
  ASSERT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &g_out, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(out_offsets, offsets);
  // Against the reference.
  std::vector<uint16_t> want(capacity * cols, 0xBEEF);
  cpu::activation_forward(ActivationArgs{
      config_of(ActivationKind::kSwiGLU), GroupRowsView{offsets.data(), rows.data(), groups}, cols,
      input.data(), SFMOE_DTYPE_BF16, want.data(), SFMOE_DTYPE_BF16, nullptr, nullptr});
  EXPECT_EQ(output, want);

  std::vector<float> d_out(capacity * cols, 1.0f), d_in(capacity * 2 * cols, NAN);
  sfmoe_grouped_tensor g_dout = grouped(d_out.data(), SFMOE_DTYPE_FP32, cols, offsets.data());
  sfmoe_grouped_tensor g_din = grouped(d_in.data(), SFMOE_DTYPE_FP32, 2 * cols, offsets.data());
  ASSERT_EQ(
      sfmoe_grouped_activation_backward(&g_in, &t_rows, &g_dout, &config, &g_din, nullptr, nullptr),
      SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(d_in[20 * 2 * cols], 0.0f) << "padding rows of group 0 get zero gradients";

  // Refusals write nothing.
  std::fill(output.begin(), output.end(), 0x1234);
  rows[0] = 33;  // more rows than the block
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &g_out, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  rows[0] = 20;
  offsets[2] = 16;  // decreasing offsets
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &g_out, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  offsets[2] = 32;
  sfmoe_grouped_tensor narrow = g_in;
  narrow.cols = cols;  // a gated kind needs 2F input columns
  EXPECT_EQ(sfmoe_grouped_activation(&narrow, &t_rows, &config, &g_out, nullptr, nullptr),
            SFMOE_ERROR_SHAPE_MISMATCH);
  sfmoe_activation_config bad = config;
  bad.kind = static_cast<sfmoe_activation>(9);
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &bad, &g_out, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  bad = config;
  bad.limit = -1.0f;
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &bad, &g_out, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  for (uint16_t v : output) ASSERT_EQ(v, 0x1234);
  // A non-gated kind takes F input columns.
  config.kind = SFMOE_ACTIVATION_SQUARED_RELU;
  EXPECT_EQ(sfmoe_grouped_activation(&narrow, &t_rows, &config, &g_out, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
}

}  // namespace
}  // namespace sfmoe

namespace sfmoe {
namespace {

// The group amax output is the largest |activation| of each group's real rows (FP32 values, before
// any rounding to the output dtype); a quantized output is refused where its scale would need the
// amax before the cast.
// A width whose gated input (twice as wide) passes int64 is refused before anything is computed
// from it (UBSan in CI would name the overflow).
TEST(ActivationApi, WidthsPastInt64AreRefusedFirst) {
  std::vector<int64_t> offsets = {0, 0};
  const int64_t huge = INT64_MAX / 2 + 1;
  sfmoe_grouped_tensor wide =
      testing::host_rows(nullptr, SFMOE_DTYPE_BF16, 1, 0, 8, 1, offsets.data());
  wide.cols = huge;
  sfmoe_grouped_tensor in =
      testing::host_rows(nullptr, SFMOE_DTYPE_BF16, 1, 0, 16, 1, offsets.data());
  sfmoe_activation_config config = sfmoe_activation_config_init();
  EXPECT_EQ(sfmoe_grouped_activation(&in, nullptr, &config, &wide, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sfmoe_grouped_activation_backward(&in, nullptr, &wide, &config, &in, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  wide.cols = -huge;
  EXPECT_EQ(sfmoe_grouped_activation(&in, nullptr, &config, &wide, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
}

TEST(ActivationApi, GroupAmaxAndFusedQuantizationRefusals) {
  const int64_t groups = 3, cols = 64, capacity = 96;
  std::vector<int64_t> offsets = {0, 32, 32, 64}, rows = {20, 0, 31};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<uint16_t> input(capacity * 2 * cols);
  for (uint16_t& v : input) v = numerics::f32_to_bf16(normal(rng));
  std::vector<float> output(capacity * cols, NAN), amax(groups, -1.0f);
  auto grouped = [&](void* data, sfmoe_dtype dtype, int64_t c) {
    return testing::host_rows(data, dtype, groups, capacity, c, 1, offsets.data());
  };
  sfmoe_grouped_tensor g_in = grouped(input.data(), SFMOE_DTYPE_BF16, 2 * cols);
  sfmoe_grouped_tensor g_out = grouped(output.data(), SFMOE_DTYPE_FP32, cols);
  g_out.amax = amax.data();
  sfmoe_tensor t_rows = testing::host_tensor(rows.data(), SFMOE_DTYPE_INT64, {groups});
  sfmoe_activation_config config = sfmoe_activation_config_init();
  ASSERT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &g_out, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  // The largest |activation| over group g's real rows of the FP32 output.
  auto group_amax = [&](int64_t g) {
    float most = 0.0f;
    for (int64_t r = offsets[g]; r < offsets[g] + rows[g]; ++r) {
      for (int64_t j = 0; j < cols; ++j) most = std::max(most, std::fabs(output[r * cols + j]));
    }
    return most;
  };
  for (int64_t g = 0; g < groups; ++g) EXPECT_EQ(amax[g], group_amax(g)) << "group " << g;
  EXPECT_EQ(amax[1], 0.0f);  // an empty group

  std::vector<uint8_t> codes(capacity * cols), scales(capacity * cols);
  sfmoe_grouped_tensor q = grouped(codes.data(), SFMOE_DTYPE_FP8_E4M3, cols);
  q.scaling = SFMOE_SCALING_TENSOR;
  q.rowwise_scale_inv = scales.data();
  q.amax = amax.data();
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &q, nullptr, nullptr),
            SFMOE_ERROR_UNSUPPORTED);
  q.scaling = SFMOE_SCALING_MX_1X32;
  q.dtype = SFMOE_DTYPE_FP4_E2M1;
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &q, nullptr, nullptr),
            SFMOE_ERROR_DTYPE_MISMATCH);
  q.dtype = SFMOE_DTYPE_FP8_E4M3;
  ASSERT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &q, nullptr, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();

  // NVFP4 1x16: the group amax is computed first, so it is taken, with E2M1 codes and an amax;
  // FP8 codes or no amax are refused, and so is stochastic rounding (the rows are written once).
  q.scaling = SFMOE_SCALING_NV_1X16;
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &q, nullptr, nullptr),
            SFMOE_ERROR_DTYPE_MISMATCH);
  q.dtype = SFMOE_DTYPE_FP4_E2M1;
  q.amax = nullptr;
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &q, nullptr, nullptr),
            SFMOE_ERROR_NULL_POINTER);
  std::vector<float> nv_amax(groups, -1.0f);
  q.amax = nv_amax.data();
  sfmoe_quantize_config stochastic = sfmoe_quantize_config_init();
  stochastic.stochastic_rounding = 1;
  config.quantize = &stochastic;
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &q, nullptr, nullptr),
            SFMOE_ERROR_UNSUPPORTED);
  // A given group amax is for the standalone quantization only.
  sfmoe_quantize_config given_amax = sfmoe_quantize_config_init();
  const std::vector<float> bound(groups, 4.0f);
  given_amax.group_amax = bound.data();
  config.quantize = &given_amax;
  EXPECT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &q, nullptr, nullptr),
            SFMOE_ERROR_UNSUPPORTED);
  EXPECT_EQ(nv_amax, std::vector<float>(groups, -1.0f)) << "refusals write nothing";
  config.quantize = nullptr;
  ASSERT_EQ(sfmoe_grouped_activation(&g_in, &t_rows, &config, &q, nullptr, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  for (int64_t g = 0; g < groups; ++g) {  // the NVFP4 tensor's amax: the activations' group amax
    EXPECT_EQ(nv_amax[g], group_amax(g)) << "group " << g;
  }
}

// The weighted form (the MoE layer's backward): with row weights w, the rule runs on w g, the
// weighted activations and each row's <g, act> come out too; in place (d_input over input,
// weighted_output over d_output) it writes the same bits.
TEST(ActivationCpu, WeightedRowsBackwardInPlaceEqualsTheRuleOnScaledGradients) {
  std::mt19937_64 rng(testing::session_test_seed() + 22);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int64_t cols = 19, row_capacity = 90;
  const std::vector<int64_t> offsets = {0, 16, 16, 48, 80};
  const std::vector<int64_t> rows = {3, 0, 32, 29};
  const GroupRowsView groups{offsets.data(), rows.data(), 4};
  for (size_t k = 0; k < 6; ++k) {
    SCOPED_TRACE(kNames[k]);
    const ActivationConfig c = config_of(kKinds[k]);
    const bool gated = activation_is_gated(c.kind);
    const int64_t in_cols = gated ? 2 * cols : cols;
    std::vector<float> input(row_capacity * in_cols), g(row_capacity * cols), w(row_capacity);
    for (size_t i = 0; i < input.size(); ++i) input[i] = i % 37 == 0 ? -0.0f : normal(rng);
    for (float& v : g) v = normal(rng);
    for (size_t r = 0; r < w.size(); ++r) w[r] = r % 11 == 0 ? 0.0f : std::abs(normal(rng)) / 4;
    std::vector<float> d_in(row_capacity * in_cols, 1234.0f), weighted(row_capacity * cols, 99.0f),
        d_w(row_capacity, 77.0f);
    ActivationBackwardArgs a{
        c,        groups,           cols,        input.data(),    SFMOE_DTYPE_FP32,
        g.data(), SFMOE_DTYPE_FP32, d_in.data(), SFMOE_DTYPE_FP32};
    a.row_weights = w.data();
    a.d_row_weights = d_w.data();
    a.weighted_output = weighted.data();
    cpu::activation_backward(a);
    for (int64_t q = 0; q < 4; ++q) {
      for (int64_t r = offsets[q]; r < offsets[q + 1]; ++r) {
        const bool real = r < offsets[q] + rows[q];
        float dot = 0.0f;
        for (int64_t j = 0; j < cols; ++j) {
          const float gv = input[r * in_cols + j], uv = gated ? input[r * in_cols + cols + j] : 0;
          const float y = real ? Activation<float>::forward(c, gv, uv) : 0.0f;
          float dg = 0.0f, du = 0.0f;
          if (real) {
            Activation<float>::backward(c, gv, uv, numerics::mul_rn(w[r], g[r * cols + j]), &dg,
                                        &du);
            dot = numerics::add_rn(dot, numerics::mul_rn(g[r * cols + j], y));
          }
          ASSERT_EQ(numerics::f32_to_bits(d_in[r * in_cols + j]), numerics::f32_to_bits(dg))
              << "row " << r;
          if (gated) {
            ASSERT_EQ(numerics::f32_to_bits(d_in[r * in_cols + cols + j]),
                      numerics::f32_to_bits(du));
          }
          ASSERT_EQ(numerics::f32_to_bits(weighted[r * cols + j]),
                    numerics::f32_to_bits(real ? numerics::mul_rn(w[r], y) : 0.0f))
              << "row " << r;
        }
        ASSERT_EQ(numerics::f32_to_bits(d_w[r]), numerics::f32_to_bits(dot)) << "row " << r;
      }
    }
    for (int64_t r = offsets[4]; r < row_capacity; ++r) {  // beyond the groups: untouched
      ASSERT_EQ(d_w[r], 77.0f);
      ASSERT_EQ(weighted[r * cols], 99.0f);
      ASSERT_EQ(d_in[r * in_cols], 1234.0f);
    }
    // In place: the same bits.
    std::vector<float> in_place = input, g_in_place = g, d_w_in_place(row_capacity, 77.0f);
    ActivationBackwardArgs b = a;
    b.input = in_place.data();
    b.d_input = in_place.data();
    b.d_output = g_in_place.data();
    b.weighted_output = g_in_place.data();
    b.d_row_weights = d_w_in_place.data();
    cpu::activation_backward(b);
    for (int64_t r = 0; r < offsets[4]; ++r) {
      ASSERT_EQ(0, std::memcmp(&in_place[r * in_cols], &d_in[r * in_cols], in_cols * 4)) << r;
      ASSERT_EQ(0, std::memcmp(&g_in_place[r * cols], &weighted[r * cols], cols * 4)) << r;
    }
    ASSERT_EQ(0, std::memcmp(d_w_in_place.data(), d_w.data(), offsets[4] * 4));
  }
}

}  // namespace
}  // namespace sfmoe

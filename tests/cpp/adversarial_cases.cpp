// The adversarial cases (tests/cpp/adversarial_cases.h). Each names the op, the broken promise
// and, in its body, what each backend documents for it.
#include "tests/cpp/adversarial_cases.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <limits>
#include <random>

#include "sfmoe/activation.h"
#include "sfmoe/ep.h"
#include "sfmoe/grouped_gemm.h"
#include "sfmoe/numerics.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/router.h"
#include "tests/cpp/host_descriptors.h"

namespace sfmoe {
namespace testing {

namespace {

// ---- helpers ------------------------------------------------------------------------------------

// What a call must have given: on the host `host` (and, when that is success, the word's flags
// `host_flags`); on the device success and exactly `device_flags` in the word.
void expect_outcome(Arena& m, sfmoe_status got, sfmoe_status host, uint32_t host_flags,
                    uint32_t device_flags) {
  if (m.on_device()) {
    EXPECT_EQ(got, SFMOE_SUCCESS) << sfmoe_last_error();
    const sfmoe_fault_report r = m.fault();
    EXPECT_EQ(r.flags, device_flags)
        << "first group " << r.first_group << " value " << r.first_value;
    EXPECT_EQ(r.count == 0, device_flags == 0);
  } else {
    EXPECT_EQ(got, host) << sfmoe_last_error();
    if (host != SFMOE_SUCCESS) {
      EXPECT_NE(std::string(sfmoe_last_error()), "") << "a refusal says why";
    }
    EXPECT_EQ(m.fault().flags, host == SFMOE_SUCCESS ? host_flags : 0u);
  }
}

// The host refuses before writing: every listed output keeps its fill.
void expect_untouched_on_host(Arena& m, std::initializer_list<const void*> outputs) {
  if (m.on_device()) return;
  for (const void* p : outputs) EXPECT_TRUE(m.untouched(p)) << "the host refused, yet wrote";
}

std::mt19937& rng() {
  static std::mt19937 engine(std::random_device{}());
  return engine;
}

// Random values in [-4, 4) with a few special ones (±0, subnormal, large): data that the fault
// paths must carry without caring.
std::vector<float> random_values(size_t n) {
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng());
  if (n > 3) {
    v[0] = -0.0f;
    v[1] = 1e-40f;
    v[2] = 300.0f;
  }
  return v;
}

std::vector<uint16_t> random_bf16(size_t n) {
  const std::vector<float> f = random_values(n);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = numerics::f32_to_bf16(f[i]);
  if (n > 0) v[0] = 0x8000;  // -0
  return v;
}

// ---- group offsets checked on their own ---------------------------------------------------------

void check_offsets_case(Arena& m, std::vector<int64_t> offsets, uint32_t flags, int64_t group) {
  int64_t* off = m.in(offsets);
  void* data = m.out(64 * 16 * 2);
  sfmoe_grouped_tensor t = rows_in(m.memory(), data, SFMOE_DTYPE_BF16, 4, 64, 16, 16, off);
  ASSERT_EQ(sfmoe_check_group_offsets(&t, m.word(), m.stream()), SFMOE_SUCCESS)
      << sfmoe_last_error();
  const sfmoe_fault_report r = m.fault();
  EXPECT_EQ(r.flags, flags);
  EXPECT_EQ(r.first_group, group);
  EXPECT_TRUE(m.untouched(data));
}

void offsets_negative(Arena& m) {
  check_offsets_case(m, {0, 16, -16, 48, 64}, SFMOE_FAULT_BAD_GROUP_OFFSETS, 1);
}
void offsets_int64_min(Arena& m) {
  check_offsets_case(m, {0, std::numeric_limits<int64_t>::min(), 32, 48, 64},
                     SFMOE_FAULT_BAD_GROUP_OFFSETS, 0);
}
void offsets_int64_max_last(Arena& m) {
  check_offsets_case(m, {0, 16, 32, 48, std::numeric_limits<int64_t>::max()},
                     SFMOE_FAULT_GROUP_OVER_CAPACITY, 3);
}

// ---- grouped quantization
// ------------------------------------------------------------------------- The quantization clamps
// bad offsets on both backends (docs/quantization.md): output offsets stay within the output's
// capacity, the fault is raised.

struct QuantizeSetup {
  sfmoe_grouped_tensor input{}, output{};
  void* data = nullptr;
  void* scales = nullptr;
  float* amax = nullptr;
  int64_t* out_offsets = nullptr;
};

QuantizeSetup quantize_setup(Arena& m, const std::vector<int64_t>& offsets, sfmoe_scaling scaling,
                             sfmoe_scale_layout layout, int64_t cols, int64_t rows,
                             std::vector<uint16_t> values = {}) {
  QuantizeSetup s;
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1;
  if (values.empty()) values = random_bf16(static_cast<size_t>(rows * cols));
  s.input = rows_in(m.memory(), m.in(values), SFMOE_DTYPE_BF16, G, rows, cols, 1, m.in(offsets));
  sfmoe_quantize_plan_request req = sfmoe_quantize_plan_request_init();
  req.dtype = scaling == SFMOE_SCALING_NV_1X16 ? SFMOE_DTYPE_FP4_E2M1 : SFMOE_DTYPE_FP8_E4M3;
  req.scaling = scaling;
  req.scale_layout = layout;
  req.num_groups = G;
  req.cols = cols;
  req.input_rows = rows;
  sfmoe_grouped_tensor_plan plan;
  plan.struct_size = sizeof(plan);
  EXPECT_EQ(sfmoe_plan_grouped_quantize(&req, &plan), SFMOE_SUCCESS) << sfmoe_last_error();
  s.output = sfmoe_grouped_tensor_init();
  s.output.memory = m.memory();
  s.output.dtype = plan.dtype;
  s.output.scaling = plan.scaling;
  s.output.scale_layout = plan.scale_layout;
  s.output.num_groups = plan.num_groups;
  s.output.row_capacity = plan.row_capacity;
  s.output.cols = plan.cols;
  s.output.row_alignment = plan.row_alignment;
  s.out_offsets = static_cast<int64_t*>(m.out(static_cast<size_t>(plan.group_offsets.bytes)));
  s.output.group_offsets = s.out_offsets;
  s.data = m.out(static_cast<size_t>(plan.rowwise_data.bytes));
  s.output.rowwise_data = s.data;
  s.scales = m.out(static_cast<size_t>(plan.rowwise_scale_inv.bytes));
  s.output.rowwise_scale_inv = s.scales;
  if (plan.amax.ndim != 0) {
    s.amax = static_cast<float*>(m.out(static_cast<size_t>(plan.amax.bytes)));
    s.output.amax = s.amax;
  }
  return s;
}

// The output offsets the op wrote obey the contract of the output whatever the input's were.
void expect_output_offsets_sane(Arena& m, const QuantizeSetup& s) {
  const int64_t G = s.output.num_groups;
  const std::vector<int64_t> off = m.get<int64_t>(s.out_offsets, static_cast<size_t>(G + 1));
  EXPECT_EQ(off[0], 0);
  for (int64_t g = 0; g < G; ++g) {
    EXPECT_LE(off[g], off[g + 1]) << g;
    EXPECT_EQ(off[g + 1] % s.output.row_alignment, 0) << g;
  }
  EXPECT_LE(off[G], s.output.row_capacity);
}

void quantize_case(Arena& m, std::vector<int64_t> offsets, sfmoe_scaling scaling,
                   sfmoe_scale_layout layout, int64_t cols, uint32_t flags) {
  QuantizeSetup s = quantize_setup(m, offsets, scaling, layout, cols, 64);
  const sfmoe_quantize_config config = sfmoe_quantize_config_init();
  const sfmoe_status st =
      sfmoe_grouped_quantize(&s.input, &s.output, &config, m.word(), m.stream());
  expect_outcome(m, st, SFMOE_SUCCESS, flags, flags);
  expect_output_offsets_sane(m, s);
}

void quantize_tensor_decreasing(Arena& m) {
  // Group 1 counts as empty, group 2 as 32 rows: the rows then exceed the capacity as well.
  quantize_case(m, {0, 16, 8, 40, 64}, SFMOE_SCALING_TENSOR, SFMOE_SCALE_LAYOUT_COMPACT, 32,
                SFMOE_FAULT_BAD_GROUP_OFFSETS | SFMOE_FAULT_GROUP_OVER_CAPACITY);
}
void quantize_tensor_over_capacity(Arena& m) {
  quantize_case(m, {0, 16, 32, 48, 100}, SFMOE_SCALING_TENSOR, SFMOE_SCALE_LAYOUT_COMPACT, 32,
                SFMOE_FAULT_GROUP_OVER_CAPACITY);
}
void quantize_block_negative(Arena& m) {
  quantize_case(m, {0, -8, 16, 40, 64}, SFMOE_SCALING_BLOCK_1X128, SFMOE_SCALE_LAYOUT_COMPACT, 128,
                SFMOE_FAULT_BAD_GROUP_OFFSETS);
}
void quantize_mx_swizzled_over_capacity(Arena& m) {
  quantize_case(m, {0, 10, 20, 30, 1000}, SFMOE_SCALING_MX_1X32, SFMOE_SCALE_LAYOUT_SWIZZLED, 64,
                SFMOE_FAULT_GROUP_OVER_CAPACITY);
}
void quantize_nvfp4_start_not_zero(Arena& m) {
  quantize_case(m, {8, 16, 32, 48, 64}, SFMOE_SCALING_NV_1X16, SFMOE_SCALE_LAYOUT_COMPACT, 32,
                SFMOE_FAULT_BAD_GROUP_OFFSETS);
}

// A NaN in group 2 with trapping on: NAN_AMAX (group 2) on both backends, group 2's amax NaN, the
// other groups' amax finite.
void quantize_nan_amax_trapped(Arena& m) {
  std::vector<uint16_t> values = random_bf16(64 * 32);
  values[40 * 32 + 5] = 0x7FC0;  // row 40: group 2 of {0, 16, 32, 48, 64}
  QuantizeSetup s = quantize_setup(m, {0, 16, 32, 48, 64}, SFMOE_SCALING_TENSOR,
                                   SFMOE_SCALE_LAYOUT_COMPACT, 32, 64, values);
  sfmoe_quantize_config config = sfmoe_quantize_config_init();
  config.trap_nan_amax = 1;
  const sfmoe_status st =
      sfmoe_grouped_quantize(&s.input, &s.output, &config, m.word(), m.stream());
  expect_outcome(m, st, SFMOE_SUCCESS, SFMOE_FAULT_NAN_AMAX, SFMOE_FAULT_NAN_AMAX);
  EXPECT_EQ(m.fault().first_group, 2);
  const std::vector<float> amax = m.get<float>(s.amax, 4);
  for (int g = 0; g < 4; ++g) EXPECT_EQ(std::isnan(amax[g]), g == 2) << g;
}

// Given per-tensor scales of NaN and +Inf (delayed scaling gone wrong): no fault (values, not
// sizes); the NaN group's codes are NaN, the Inf group's saturate at E4M3's largest magnitude
// (its conversion saturates; no input is 0, whose product with Inf would be NaN), the other
// groups' codes are those of a run with good scales.
void quantize_given_scales_nan_inf(Arena& m) {
  const std::vector<int64_t> offsets = {0, 16, 32, 48, 64};
  std::vector<uint16_t> values = random_bf16(64 * 32);
  for (uint16_t& v : values) v = (v & 0x7FFF) == 0 ? numerics::f32_to_bf16(0.5f) : v;
  QuantizeSetup good =
      quantize_setup(m, offsets, SFMOE_SCALING_TENSOR, SFMOE_SCALE_LAYOUT_COMPACT, 32, 64, values);
  QuantizeSetup bad =
      quantize_setup(m, offsets, SFMOE_SCALING_TENSOR, SFMOE_SCALE_LAYOUT_COMPACT, 32, 64, values);
  const float inf = std::numeric_limits<float>::infinity();
  sfmoe_quantize_config config = sfmoe_quantize_config_init();
  config.tensor_scales = m.in(std::vector<float>{2.0f, 4.0f, 8.0f, 16.0f});
  ASSERT_EQ(sfmoe_grouped_quantize(&good.input, &good.output, &config, m.word(), m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  config.tensor_scales = m.in(std::vector<float>{2.0f, std::nanf(""), inf, 16.0f});
  ASSERT_EQ(sfmoe_grouped_quantize(&bad.input, &bad.output, &config, m.word(), m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(m.fault().flags, 0u);
  const std::vector<uint8_t> a = m.get<uint8_t>(good.data, 64 * 32);
  const std::vector<uint8_t> b = m.get<uint8_t>(bad.data, 64 * 32);
  for (int64_t row = 0; row < 64; ++row) {
    for (int64_t c = 0; c < 32; ++c) {
      const size_t i = static_cast<size_t>(row * 32 + c);
      if (row >= 16 && row < 32) {
        ASSERT_EQ(b[i] & 0x7F, 0x7F) << "row " << row << ": NaN code expected";
      } else if (row >= 32 && row < 48) {
        ASSERT_EQ(b[i] & 0x7F, 0x7E) << "row " << row << ": 448 expected";
      } else {
        ASSERT_EQ(a[i], b[i]) << "row " << row << " of a group with a good scale";
      }
    }
  }
}

// The caller's group amax holds a NaN with trapping on: NAN_AMAX, as for a computed one.
void quantize_given_amax_nan_trapped(Arena& m) {
  QuantizeSetup s = quantize_setup(m, {0, 16, 32, 48, 64}, SFMOE_SCALING_TENSOR,
                                   SFMOE_SCALE_LAYOUT_COMPACT, 32, 64);
  sfmoe_quantize_config config = sfmoe_quantize_config_init();
  config.trap_nan_amax = 1;
  config.group_amax = m.in(std::vector<float>{4.0f, 300.0f, std::nanf(""), 300.0f});
  const sfmoe_status st =
      sfmoe_grouped_quantize(&s.input, &s.output, &config, m.word(), m.stream());
  expect_outcome(m, st, SFMOE_SUCCESS, SFMOE_FAULT_NAN_AMAX, SFMOE_FAULT_NAN_AMAX);
}

void amax_over_capacity(Arena& m) {
  int64_t* off = m.in(std::vector<int64_t>{0, 16, 32, 48, 4096});
  sfmoe_grouped_tensor t =
      rows_in(m.memory(), m.in(random_bf16(64 * 32)), SFMOE_DTYPE_BF16, 4, 64, 32, 1, off);
  float* amax = static_cast<float*>(m.out(4 * sizeof(float)));
  const sfmoe_status st = sfmoe_grouped_amax(&t, amax, m.word(), m.stream());
  expect_outcome(m, st, SFMOE_SUCCESS, SFMOE_FAULT_GROUP_OVER_CAPACITY,
                 SFMOE_FAULT_GROUP_OVER_CAPACITY);
  for (float v : m.get<float>(amax, 4)) EXPECT_TRUE(std::isfinite(v));
}

// ---- grouped GEMM
// --------------------------------------------------------------------------------- BF16 operands,
// 4 groups, 64 rows, K = N = 32. The host refuses bad offsets of a; the device clamps them (or
// skips a group) and raises the fault.

struct GemmSetup {
  sfmoe_grouped_tensor a{}, b{}, out{};
  sfmoe_tensor workspace{};
  void* out_data = nullptr;
};

GemmSetup gemm_setup(Arena& m, sfmoe_gemm_form form, const std::vector<int64_t>& offsets,
                     sfmoe_dtype out_dtype = SFMOE_DTYPE_BF16) {
  GemmSetup s;
  const int64_t G = 4, R = 64, K = 32, N = 32;
  int64_t* off = m.in(offsets);
  const int64_t a_cols = form == SFMOE_GEMM_FPROP ? K : N;
  s.a = rows_in(m.memory(), m.in(random_bf16(R * a_cols)), SFMOE_DTYPE_BF16, G, R, a_cols, 1, off);
  const size_t out_elem = out_dtype == SFMOE_DTYPE_FP32 ? 4 : 2;
  if (form == SFMOE_GEMM_WGRAD) {
    s.b = rows_in(m.memory(), m.in(random_bf16(R * K)), SFMOE_DTYPE_BF16, G, R, K, 1, off);
    s.out_data = m.out(static_cast<size_t>(G * N * K) * out_elem);
    s.out = rows_in(m.memory(), s.out_data, out_dtype, G, G * N, K, 1, nullptr);
    s.out.uniform_group_rows = N;
  } else {
    s.b = rows_in(m.memory(), m.in(random_bf16(G * N * K)), SFMOE_DTYPE_BF16, G, G * N, K, 1,
                  nullptr);
    s.b.uniform_group_rows = N;
    const int64_t out_cols = form == SFMOE_GEMM_FPROP ? N : K;
    s.out_data = m.out(static_cast<size_t>(R * out_cols) * out_elem);
    s.out = rows_in(m.memory(), s.out_data, out_dtype, G, R, out_cols, 1, off);
  }
  const int64_t ws =
      sfmoe_grouped_gemm_workspace_bytes(G, SFMOE_SCALING_NONE, s.a.row_capacity, s.a.cols,
                                         SFMOE_SCALING_NONE, s.b.row_capacity, s.b.cols);
  const int64_t ws_bytes = ws > 0 ? ws : 16;
  s.workspace = tensor(m, m.out(static_cast<size_t>(ws_bytes)), SFMOE_DTYPE_INT64, {ws_bytes / 8});
  return s;
}

void gemm_case(Arena& m, sfmoe_gemm_form form, std::vector<int64_t> offsets, uint32_t flags,
               int32_t accumulate = 0) {
  GemmSetup s = gemm_setup(m, form, offsets, accumulate ? SFMOE_DTYPE_FP32 : SFMOE_DTYPE_BF16);
  sfmoe_grouped_gemm_config config = sfmoe_grouped_gemm_config_init();
  config.form = form;
  config.accumulate = accumulate;
  const sfmoe_status st =
      sfmoe_grouped_gemm(&s.a, &s.b, &config, &s.out, &s.workspace, m.word(), m.stream());
  expect_outcome(m, st, SFMOE_ERROR_INVALID_ARGUMENT, 0, flags);
  expect_untouched_on_host(m, {s.out_data});
}

void gemm_fprop_decreasing(Arena& m) {
  gemm_case(m, SFMOE_GEMM_FPROP, {0, 30, 10, 50, 64}, SFMOE_FAULT_BAD_GROUP_OFFSETS);
}
void gemm_fprop_over_capacity(Arena& m) {
  gemm_case(m, SFMOE_GEMM_FPROP, {0, 16, 32, 48, 65}, SFMOE_FAULT_GROUP_OVER_CAPACITY);
}
void gemm_dgrad_negative(Arena& m) {
  gemm_case(m, SFMOE_GEMM_DGRAD, {0, 16, -32, 48, 64}, SFMOE_FAULT_BAD_GROUP_OFFSETS);
}
void gemm_dgrad_int64_max(Arena& m) {
  gemm_case(m, SFMOE_GEMM_DGRAD, {0, 16, 32, std::numeric_limits<int64_t>::max(), 64},
            SFMOE_FAULT_BAD_GROUP_OFFSETS | SFMOE_FAULT_GROUP_OVER_CAPACITY);
}
void gemm_wgrad_over_capacity(Arena& m) {
  gemm_case(m, SFMOE_GEMM_WGRAD, {0, 16, 32, 48, 1 << 20}, SFMOE_FAULT_GROUP_OVER_CAPACITY);
}
void gemm_wgrad_accumulate_start_not_zero(Arena& m) {
  gemm_case(m, SFMOE_GEMM_WGRAD, {5, 16, 32, 48, 64}, SFMOE_FAULT_BAD_GROUP_OFFSETS, 1);
}

// ---- grouped activation
// ----------------------------------------------------------------------------- SwiGLU over [64, 2F
// = 64] BF16 rows, 4 groups at offsets aligned to 16, group_rows the real rows.

struct ActivationSetup {
  sfmoe_grouped_tensor input{}, output{}, d_output{}, d_input{};
  sfmoe_tensor group_rows{};
  void* out_data = nullptr;
  void* d_input_data = nullptr;
};

ActivationSetup activation_setup(Arena& m, const std::vector<int64_t>& offsets,
                                 const std::vector<int64_t>& rows) {
  ActivationSetup s;
  const int64_t G = 4, R = 64, F = 32;
  int64_t* off = m.in(offsets);
  s.input =
      rows_in(m.memory(), m.in(random_bf16(R * 2 * F)), SFMOE_DTYPE_BF16, G, R, 2 * F, 16, off);
  s.out_data = m.out(R * F * 2);
  s.output = rows_in(m.memory(), s.out_data, SFMOE_DTYPE_BF16, G, R, F, 16, off);
  s.d_output = rows_in(m.memory(), m.in(random_bf16(R * F)), SFMOE_DTYPE_BF16, G, R, F, 16, off);
  s.d_input_data = m.out(R * 2 * F * 2);
  s.d_input = rows_in(m.memory(), s.d_input_data, SFMOE_DTYPE_BF16, G, R, 2 * F, 16, off);
  s.group_rows = tensor(m, m.in(rows), SFMOE_DTYPE_INT64, {G});
  return s;
}

void activation_case(Arena& m, std::vector<int64_t> offsets, std::vector<int64_t> rows,
                     bool backward, sfmoe_status host, uint32_t flags) {
  ActivationSetup s = activation_setup(m, offsets, rows);
  const sfmoe_activation_config config = sfmoe_activation_config_init();
  const sfmoe_status st =
      backward ? sfmoe_grouped_activation_backward(&s.input, &s.group_rows, &s.d_output, &config,
                                                   &s.d_input, m.word(), m.stream())
               : sfmoe_grouped_activation(&s.input, &s.group_rows, &config, &s.output, m.word(),
                                          m.stream());
  expect_outcome(m, st, host, 0, flags);
  expect_untouched_on_host(m, {s.out_data, s.d_input_data});
}

void activation_rows_beyond_block(Arena& m) {
  activation_case(m, {0, 16, 32, 48, 64}, {16, 17, 0, 16}, false, SFMOE_ERROR_INVALID_ARGUMENT,
                  SFMOE_FAULT_GROUP_OVER_CAPACITY);
}
void activation_rows_negative(Arena& m) {
  activation_case(m, {0, 16, 32, 48, 64}, {16, -3, 0, 16}, false, SFMOE_ERROR_INVALID_ARGUMENT,
                  SFMOE_FAULT_GROUP_OVER_CAPACITY);
}
void activation_offsets_decreasing(Arena& m) {
  activation_case(m, {0, 32, 16, 48, 64}, {16, 0, 0, 16}, false, SFMOE_ERROR_INVALID_ARGUMENT,
                  SFMOE_FAULT_BAD_GROUP_OFFSETS);
}
void activation_offsets_misaligned(Arena& m) {
  activation_case(m, {0, 8, 32, 48, 64}, {8, 16, 16, 16}, false, SFMOE_ERROR_INVALID_ARGUMENT,
                  SFMOE_FAULT_BAD_GROUP_OFFSETS);
}
void activation_backward_rows_beyond_block(Arena& m) {
  activation_case(m, {0, 16, 32, 48, 64}, {16, 16, 1 << 30, 16}, true, SFMOE_ERROR_INVALID_ARGUMENT,
                  SFMOE_FAULT_GROUP_OVER_CAPACITY);
}
void activation_backward_over_capacity(Arena& m) {
  activation_case(m, {0, 16, 32, 48, 80}, {16, 16, 16, 16}, true, SFMOE_ERROR_INVALID_ARGUMENT,
                  SFMOE_FAULT_GROUP_OVER_CAPACITY);
}

// The fused MXFP8 output quantization with a group's rows beyond its block.
void activation_fused_mx_rows_beyond_block(Arena& m) {
  const int64_t G = 4, R = 64, F = 32;
  int64_t* off = m.in(std::vector<int64_t>{0, 32, 32, 64, 64});
  sfmoe_grouped_tensor input =
      rows_in(m.memory(), m.in(random_bf16(R * 2 * F)), SFMOE_DTYPE_BF16, G, R, 2 * F, 32, off);
  sfmoe_activation_plan_request req = sfmoe_activation_plan_request_init();
  req.num_groups = G;
  req.row_capacity = R;
  req.input_cols = 2 * F;
  req.row_alignment = 32;
  req.dtype = SFMOE_DTYPE_FP8_E4M3;
  req.scaling = SFMOE_SCALING_MX_1X32;
  sfmoe_grouped_tensor_plan plan;
  plan.struct_size = sizeof(plan);
  ASSERT_EQ(sfmoe_plan_grouped_activation(&req, &plan), SFMOE_SUCCESS) << sfmoe_last_error();
  sfmoe_grouped_tensor output = sfmoe_grouped_tensor_init();
  output.memory = m.memory();
  output.dtype = plan.dtype;
  output.scaling = plan.scaling;
  output.scale_layout = plan.scale_layout;
  output.num_groups = G;
  output.row_capacity = plan.row_capacity;
  output.cols = plan.cols;
  output.row_alignment = plan.row_alignment;
  output.group_offsets = off;
  void* data = m.out(static_cast<size_t>(plan.rowwise_data.bytes));
  void* scales = m.out(static_cast<size_t>(plan.rowwise_scale_inv.bytes));
  output.rowwise_data = data;
  output.rowwise_scale_inv = scales;
  const sfmoe_tensor rows =
      tensor(m, m.in(std::vector<int64_t>{32, 0, 33, 0}), SFMOE_DTYPE_INT64, {G});
  const sfmoe_activation_config config = sfmoe_activation_config_init();
  const sfmoe_status st =
      sfmoe_grouped_activation(&input, &rows, &config, &output, m.word(), m.stream());
  expect_outcome(m, st, SFMOE_ERROR_INVALID_ARGUMENT, 0, SFMOE_FAULT_GROUP_OVER_CAPACITY);
  expect_untouched_on_host(m, {data, scales});
}

// ---- permute
// ---------------------------------------------------------------------------------------- T = 16
// tokens, k = 2, E = 4 experts, H = 32 FP32 (or BF16 with the fused quantization), row alignment 8.
// The host refuses bad ids; the device skips the slot (row -1), counts only the good ones and
// raises BAD_INDEX.

struct PermuteRun {
  sfmoe_status status;
  std::vector<int64_t> row_map, kept;
  void* permuted = nullptr;
  void* row_map_buf = nullptr;
};

PermuteRun permute_run(Arena& m, std::vector<int32_t> ids, int64_t capacity, bool fused_mx) {
  const int64_t T = 16, k = 2, E = 4, H = 32;
  sfmoe_permute_plan_request req = sfmoe_permute_plan_request_init();
  req.num_tokens = T;
  req.topk = k;
  req.num_experts = E;
  req.hidden = H;
  req.row_alignment = fused_mx ? 32 : 8;
  req.expert_capacity = capacity;
  req.dtype = fused_mx ? SFMOE_DTYPE_FP8_E4M3 : SFMOE_DTYPE_FP32;
  req.scaling = fused_mx ? SFMOE_SCALING_MX_1X32 : SFMOE_SCALING_NONE;
  sfmoe_permute_plan plan;
  plan.struct_size = sizeof(plan);
  plan.permuted.struct_size = sizeof(plan.permuted);
  EXPECT_EQ(sfmoe_plan_permute(&req, &plan), SFMOE_SUCCESS) << sfmoe_last_error();
  PermuteRun r;
  const sfmoe_tensor tokens = fused_mx
                                  ? tensor(m, m.in(random_bf16(T * H)), SFMOE_DTYPE_BF16, {T, H})
                                  : tensor(m, m.in(random_values(T * H)), SFMOE_DTYPE_FP32, {T, H});
  const sfmoe_tensor t_ids = tensor(m, m.in(ids), SFMOE_DTYPE_INT32, {T, k});
  sfmoe_grouped_tensor permuted = sfmoe_grouped_tensor_init();
  permuted.memory = m.memory();
  permuted.dtype = plan.permuted.dtype;
  permuted.scaling = plan.permuted.scaling;
  permuted.scale_layout = plan.permuted.scale_layout;
  permuted.num_groups = E;
  permuted.row_capacity = plan.permuted.row_capacity;
  permuted.cols = H;
  permuted.row_alignment = plan.permuted.row_alignment;
  int64_t* offsets = static_cast<int64_t*>(m.out((E + 1) * 8));
  permuted.group_offsets = offsets;
  r.permuted = m.out(static_cast<size_t>(plan.permuted.rowwise_data.bytes));
  permuted.rowwise_data = r.permuted;
  void* scales = nullptr;
  if (fused_mx) {
    scales = m.out(static_cast<size_t>(plan.permuted.rowwise_scale_inv.bytes));
    permuted.rowwise_scale_inv = scales;
  }
  r.row_map_buf = m.out(T * k * 8);
  void* kept = m.out(E * 8);
  void* dropped = m.out(E * 8);
  const sfmoe_tensor t_map = tensor(m, r.row_map_buf, SFMOE_DTYPE_INT64, {T, k});
  const sfmoe_tensor t_kept = tensor(m, kept, SFMOE_DTYPE_INT64, {E});
  const sfmoe_tensor t_dropped = tensor(m, dropped, SFMOE_DTYPE_INT64, {E});
  const int64_t ws_bytes = std::max<int64_t>(16, sfmoe_permute_workspace_bytes(T, E));
  const sfmoe_tensor ws =
      tensor(m, m.out(static_cast<size_t>(ws_bytes)), SFMOE_DTYPE_INT64, {(ws_bytes + 7) / 8});
  sfmoe_permute_config config = sfmoe_permute_config_init();
  config.expert_capacity = capacity;
  r.status = sfmoe_permute(&tokens, &t_ids, &config, &permuted, &t_map, &t_kept, &t_dropped, &ws,
                           m.word(), m.stream());
  expect_untouched_on_host(m, {r.permuted, r.row_map_buf, kept, dropped, offsets});
  if (scales != nullptr) expect_untouched_on_host(m, {scales});
  r.row_map = m.get<int64_t>(r.row_map_buf, T * k);
  r.kept = m.get<int64_t>(kept, E);
  return r;
}

std::vector<int32_t> balanced_ids() {
  std::vector<int32_t> ids(32);
  for (int t = 0; t < 16; ++t) {
    ids[2 * t] = t % 4;
    ids[2 * t + 1] = (t + 1) % 4;
  }
  return ids;
}

void permute_case(Arena& m, int bad_slot, int32_t bad_id, int64_t capacity, bool fused_mx) {
  std::vector<int32_t> ids = balanced_ids();
  ids[bad_slot] = bad_id;
  const PermuteRun r = permute_run(m, ids, capacity, fused_mx);
  expect_outcome(m, r.status, SFMOE_ERROR_INVALID_ARGUMENT, 0, SFMOE_FAULT_BAD_INDEX);
  if (!m.on_device()) return;
  EXPECT_EQ(r.row_map[bad_slot], -1) << "the bad slot is skipped";
  int64_t kept = 0;
  for (int64_t v : r.kept) kept += v;
  int64_t mapped = 0;
  for (int64_t v : r.row_map) mapped += v >= 0;
  EXPECT_EQ(kept, mapped) << "counts name exactly the rows placed";
  if (capacity == 0) {
    EXPECT_EQ(kept, 31);
  }
}

void permute_id_equal_to_experts(Arena& m) { permute_case(m, 7, 4, 0, false); }
void permute_id_negative(Arena& m) { permute_case(m, 0, -1, 0, false); }
void permute_id_int32_min_fused_mx(Arena& m) {
  permute_case(m, 31, std::numeric_limits<int32_t>::min(), 0, true);
}
void permute_id_large_with_capacity(Arena& m) { permute_case(m, 12, 1 << 30, 3, false); }
// Token 5 names expert 1 twice (its second slot): the second naming is skipped.
void permute_id_named_twice(Arena& m) {
  std::vector<int32_t> ids = balanced_ids();
  ids[11] = ids[10];
  const PermuteRun r = permute_run(m, ids, 0, false);
  expect_outcome(m, r.status, SFMOE_ERROR_INVALID_ARGUMENT, 0, SFMOE_FAULT_BAD_INDEX);
  if (!m.on_device()) return;
  EXPECT_GE(r.row_map[10], 0);
  EXPECT_EQ(r.row_map[11], -1);
}

// ---- unpermute and its backward
// ---------------------------------------------------------------------- 4 groups of 8 rows (32
// rows of H = 32 FP32), T = 16 tokens, k = 2, each slot its own row.

struct UnpermuteSetup {
  sfmoe_grouped_tensor rows{}, d_rows{};
  sfmoe_tensor row_map{}, probs{}, out{}, d_out{}, group_rows{}, d_probs{};
  void* out_data = nullptr;
  void* d_rows_data = nullptr;
  void* d_probs_data = nullptr;
  std::vector<float> values, probs_values;
};

UnpermuteSetup unpermute_setup(Arena& m, std::vector<int64_t> map, std::vector<float> probs) {
  UnpermuteSetup s;
  const int64_t G = 4, R = 32, T = 16, k = 2, H = 32;
  int64_t* off = m.in(std::vector<int64_t>{0, 8, 16, 24, 32});
  s.values = random_values(R * H);
  s.rows = rows_in(m.memory(), m.in(s.values), SFMOE_DTYPE_FP32, G, R, H, 8, off);
  s.d_rows_data = m.out(R * H * 4);
  s.d_rows = rows_in(m.memory(), s.d_rows_data, SFMOE_DTYPE_FP32, G, R, H, 8, off);
  s.row_map = tensor(m, m.in(map), SFMOE_DTYPE_INT64, {T, k});
  s.probs_values = probs;
  s.probs = tensor(m, m.in(probs), SFMOE_DTYPE_FP32, {T, k});
  s.out_data = m.out(T * H * 4);
  s.out = tensor(m, s.out_data, SFMOE_DTYPE_FP32, {T, H});
  s.d_out = tensor(m, m.in(random_values(T * H)), SFMOE_DTYPE_FP32, {T, H});
  s.group_rows = tensor(m, m.in(std::vector<int64_t>{8, 8, 8, 8}), SFMOE_DTYPE_INT64, {G});
  s.d_probs_data = m.out(T * k * 4);
  s.d_probs = tensor(m, s.d_probs_data, SFMOE_DTYPE_FP32, {T, k});
  return s;
}

std::vector<int64_t> identity_map() {
  std::vector<int64_t> map(32);
  for (int i = 0; i < 32; ++i) map[i] = i;
  return map;
}

std::vector<float> half_probs() { return std::vector<float>(32, 0.5f); }

void unpermute_bad_row(Arena& m, int slot, int64_t row) {
  std::vector<int64_t> map = identity_map();
  map[slot] = row;
  UnpermuteSetup s = unpermute_setup(m, map, half_probs());
  const sfmoe_status st =
      sfmoe_unpermute(&s.rows, &s.row_map, &s.probs, &s.out, m.word(), m.stream());
  expect_outcome(m, st, SFMOE_ERROR_INVALID_ARGUMENT, 0, SFMOE_FAULT_BAD_INDEX);
  expect_untouched_on_host(m, {s.out_data});
  if (!m.on_device()) return;
  // The bad slot contributes nothing: its token is the other slot's row times its weight.
  const std::vector<float> out = m.get<float>(s.out_data, 16 * 32);
  const int t = slot / 2, other = slot ^ 1;
  for (int h = 0; h < 32; ++h) {
    EXPECT_EQ(out[t * 32 + h], 0.5f * s.values[other * 32 + h]) << h;
  }
}

void unpermute_row_beyond_capacity(Arena& m) { unpermute_bad_row(m, 9, 32); }
void unpermute_row_negative(Arena& m) { unpermute_bad_row(m, 4, -7); }
void unpermute_row_int64_min(Arena& m) {
  unpermute_bad_row(m, 30, std::numeric_limits<int64_t>::min());
}

// NaN and Inf probabilities are values: no fault, and only their tokens are non-finite.
void unpermute_nan_inf_probs(Arena& m) {
  std::vector<float> probs = half_probs();
  probs[6] = std::nanf("");
  probs[13] = std::numeric_limits<float>::infinity();
  UnpermuteSetup s = unpermute_setup(m, identity_map(), probs);
  ASSERT_EQ(sfmoe_unpermute(&s.rows, &s.row_map, &s.probs, &s.out, m.word(), m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(m.fault().flags, 0u);
  const std::vector<float> out = m.get<float>(s.out_data, 16 * 32);
  for (int t = 0; t < 16; ++t) {
    for (int h = 0; h < 32; ++h) {
      const float v = out[t * 32 + h];
      if (t == 3) {
        EXPECT_TRUE(std::isnan(v)) << h;
      } else if (t != 6) {
        EXPECT_TRUE(std::isfinite(v)) << "token " << t;
      }
    }
  }
}

void unpermute_backward_bad_row(Arena& m, int slot, int64_t row, std::vector<int64_t> group_rows,
                                uint32_t flags) {
  std::vector<int64_t> map = identity_map();
  if (slot >= 0) map[slot] = row;
  UnpermuteSetup s = unpermute_setup(m, map, half_probs());
  s.group_rows = tensor(m, m.in(group_rows), SFMOE_DTYPE_INT64, {4});
  const sfmoe_status st =
      sfmoe_unpermute_backward(&s.d_out, &s.rows, &s.row_map, &s.probs, &s.group_rows, &s.d_rows,
                               &s.d_probs, m.word(), m.stream());
  expect_outcome(m, st, SFMOE_ERROR_INVALID_ARGUMENT, 0, flags);
  expect_untouched_on_host(m, {s.d_rows_data, s.d_probs_data});
  if (!m.on_device() || slot < 0) return;
  EXPECT_EQ(m.get<float>(s.d_probs_data, 32)[slot], 0.0f) << "a skipped slot has no gradient";
}

void unpermute_backward_row_beyond_capacity(Arena& m) {
  unpermute_backward_bad_row(m, 3, 1000, {8, 8, 8, 8}, SFMOE_FAULT_BAD_INDEX);
}
void unpermute_backward_row_negative(Arena& m) {
  unpermute_backward_bad_row(m, 20, -2, {8, 8, 8, 8}, SFMOE_FAULT_BAD_INDEX);
}
void unpermute_backward_group_rows_beyond_block(Arena& m) {
  unpermute_backward_bad_row(m, -1, 0, {8, 9, 8, 8}, SFMOE_FAULT_GROUP_OVER_CAPACITY);
}

// ---- router
// ------------------------------------------------------------------------------------------- T = 8
// tokens, E = 8 experts, k = 2.

void router_backward_bad_id(Arena& m, int slot, int32_t id) {
  const int64_t T = 8, E = 8, k = 2;
  std::vector<int32_t> ids(T * k);
  for (int i = 0; i < T * k; ++i) ids[i] = static_cast<int32_t>(i % E);
  ids[slot] = id;
  const sfmoe_tensor logits = tensor(m, m.in(random_values(T * E)), SFMOE_DTYPE_FP32, {T, E});
  const sfmoe_tensor t_ids = tensor(m, m.in(ids), SFMOE_DTYPE_INT32, {T, k});
  const sfmoe_tensor counts = tensor(m, m.in(std::vector<int64_t>(E, 2)), SFMOE_DTYPE_INT64, {E});
  const sfmoe_tensor dp = tensor(m, m.in(random_values(T * k)), SFMOE_DTYPE_FP32, {T, k});
  void* dl = m.out(T * E * 4);
  const sfmoe_tensor t_dl = tensor(m, dl, SFMOE_DTYPE_FP32, {T, E});
  sfmoe_router_config c = sfmoe_router_config_init();
  c.top_k = k;
  c.aux_loss_coeff = 0.01f;
  const sfmoe_status st = sfmoe_router_backward(&logits, &t_ids, &counts, &c, &dp, 1.0f, 0.0f,
                                                &t_dl, m.word(), m.stream());
  expect_outcome(m, st, SFMOE_ERROR_INVALID_ARGUMENT, 0, SFMOE_FAULT_BAD_INDEX);
  expect_untouched_on_host(m, {dl});
  if (!m.on_device()) return;
  for (float v : m.get<float>(dl, T * E)) EXPECT_TRUE(std::isfinite(v));
}

void router_backward_id_equal_to_experts(Arena& m) { router_backward_bad_id(m, 5, 8); }
void router_backward_id_negative(Arena& m) { router_backward_bad_id(m, 0, -3); }

// NaN and Inf logits and bias are values: no fault; every token still gets k distinct experts
// in range, and a row with one finite logit among NaNs selects it first.
void router_forward_nonfinite(Arena& m) {
  const int64_t T = 8, E = 8, k = 2;
  std::vector<float> logits = random_values(T * E);
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  for (int e = 0; e < E; ++e) logits[0 * E + e] = nan;                  // all NaN
  for (int e = 0; e < E; ++e) logits[1 * E + e] = e == 5 ? 1.0f : nan;  // one number
  logits[2 * E + 3] = inf;
  logits[2 * E + 4] = -inf;
  for (int e = 0; e < E; ++e) logits[3 * E + e] = -inf;
  std::vector<float> bias(E, 0.0f);
  bias[6] = nan;
  bias[7] = -inf;
  for (int score = 0; score < 2; ++score) {
    const sfmoe_tensor t_logits = tensor(m, m.in(logits), SFMOE_DTYPE_FP32, {T, E});
    const sfmoe_tensor t_bias = tensor(m, m.in(bias), SFMOE_DTYPE_FP32, {E});
    void* ids = m.out(T * k * 4);
    void* probs = m.out(T * k * 4);
    void* counts = m.out(E * 8);
    const sfmoe_tensor t_ids = tensor(m, ids, SFMOE_DTYPE_INT32, {T, k});
    const sfmoe_tensor t_probs = tensor(m, probs, SFMOE_DTYPE_FP32, {T, k});
    const sfmoe_tensor t_counts = tensor(m, counts, SFMOE_DTYPE_INT64, {E});
    sfmoe_router_config c = sfmoe_router_config_init();
    c.top_k = k;
    c.score = score ? SFMOE_ROUTER_SCORE_SIGMOID : SFMOE_ROUTER_SCORE_SOFTMAX;
    c.normalize = score;
    ASSERT_EQ(sfmoe_router_forward(&t_logits, &t_bias, &c, &t_ids, &t_probs, &t_counts, nullptr,
                                   nullptr, nullptr, m.stream()),
              SFMOE_SUCCESS)
        << sfmoe_last_error();
    const std::vector<int32_t> got = m.get<int32_t>(ids, T * k);
    std::vector<int64_t> per_expert(E, 0);
    for (int t = 0; t < T; ++t) {
      EXPECT_NE(got[t * k], got[t * k + 1]) << "token " << t;
      for (int i = 0; i < k; ++i) {
        ASSERT_GE(got[t * k + i], 0);
        ASSERT_LT(got[t * k + i], E);
        ++per_expert[got[t * k + i]];
      }
    }
    EXPECT_EQ(got[1 * k], 5) << "the one number ranks above the NaNs";
    EXPECT_EQ(m.get<int64_t>(counts, E), per_expert);
  }
  EXPECT_EQ(m.fault().flags, 0u);
}

// ---- expert parallelism (loopback)
// --------------------------------------------------------------- R = 2 ranks, E_l = 2 (E = 4), T =
// 8 tokens a rank, k = 2, H = 32 FP32 rows.

struct EpRanks {
  sfmoe_ep_group* group = nullptr;
  sfmoe_ep_plan plan{};
  std::vector<sfmoe_tensor> tokens, ids, received, offsets, handle, kept, routed, dropped;
  std::vector<void*> received_data, handle_data, dropped_data;
  ~EpRanks() {
    if (group != nullptr) sfmoe_ep_group_destroy(group);
  }
};

constexpr int64_t kEpRanks = 2, kEpLocal = 2, kEpTokens = 8, kEpTopk = 2, kEpHidden = 32;

sfmoe_status ep_dispatch(Arena& m, EpRanks& e, std::vector<std::vector<int32_t>> ids,
                         int64_t capacity, sfmoe_ep_overflow overflow) {
  sfmoe_ep_config c = sfmoe_ep_config_init();
  c.world_size = static_cast<int32_t>(kEpRanks);
  c.experts_per_rank = kEpLocal;
  c.max_tokens_per_rank = kEpTokens;
  c.top_k = kEpTopk;
  c.hidden = kEpHidden;
  c.payload = SFMOE_DTYPE_FP32;
  c.receive_capacity = capacity;
  c.overflow = overflow;
  EXPECT_EQ(sfmoe_ep_group_create(&c, m.memory(), 0, &e.group), SFMOE_SUCCESS)
      << sfmoe_last_error();
  e.plan = sfmoe_ep_plan_init();
  EXPECT_EQ(sfmoe_ep_group_get_plan(e.group, &e.plan), SFMOE_SUCCESS);
  const int64_t E = kEpRanks * kEpLocal;
  for (int64_t r = 0; r < kEpRanks; ++r) {
    e.tokens.push_back(tensor(m, m.in(random_values(kEpTokens * kEpHidden)), SFMOE_DTYPE_FP32,
                              {kEpTokens, kEpHidden}));
    e.ids.push_back(tensor(m, m.in(ids[r]), SFMOE_DTYPE_INT32, {kEpTokens, kEpTopk}));
    e.received_data.push_back(m.out(static_cast<size_t>(e.plan.receive_rows * kEpHidden * 4)));
    e.received.push_back(
        tensor(m, e.received_data.back(), SFMOE_DTYPE_FP32, {e.plan.receive_rows, kEpHidden}));
    e.offsets.push_back(tensor(m, m.out(static_cast<size_t>(8 * e.plan.rounds * (kEpLocal + 1))),
                               SFMOE_DTYPE_INT64, {e.plan.rounds * (kEpLocal + 1)}));
    e.handle_data.push_back(m.out(static_cast<size_t>(e.plan.handle_bytes)));
    e.handle.push_back(
        tensor(m, e.handle_data.back(), SFMOE_DTYPE_INT64, {e.plan.handle_bytes / 8}));
    e.kept.push_back(tensor(m, m.out(static_cast<size_t>(8 * e.plan.rounds * kEpLocal)),
                            SFMOE_DTYPE_INT64, {e.plan.rounds * kEpLocal}));
    e.routed.push_back(tensor(m, m.out(8 * kEpLocal), SFMOE_DTYPE_INT64, {kEpLocal}));
    e.dropped_data.push_back(m.out(static_cast<size_t>(8 * E)));
    e.dropped.push_back(tensor(m, e.dropped_data.back(), SFMOE_DTYPE_INT64, {E}));
  }
  std::vector<const sfmoe_tensor*> p_tokens, p_ids, p_received, p_offsets, p_handle, p_kept,
      p_routed, p_dropped;
  for (int64_t r = 0; r < kEpRanks; ++r) {
    p_tokens.push_back(&e.tokens[r]);
    p_ids.push_back(&e.ids[r]);
    p_received.push_back(&e.received[r]);
    p_offsets.push_back(&e.offsets[r]);
    p_handle.push_back(&e.handle[r]);
    p_kept.push_back(&e.kept[r]);
    p_routed.push_back(&e.routed[r]);
    p_dropped.push_back(&e.dropped[r]);
  }
  sfmoe_ep_dispatch_args a = sfmoe_ep_dispatch_args_init();
  a.tokens = p_tokens.data();
  a.topk_ids = p_ids.data();
  a.received = p_received.data();
  a.group_offsets = p_offsets.data();
  a.handle = p_handle.data();
  a.tokens_per_expert = p_kept.data();
  a.routed_per_expert = p_routed.data();
  a.dropped_per_expert = p_dropped.data();
  a.word = m.word();
  a.stream = m.stream();
  return sfmoe_ep_dispatch(e.group, &a);
}

std::vector<std::vector<int32_t>> ep_ids() {
  std::vector<std::vector<int32_t>> ids(kEpRanks, std::vector<int32_t>(kEpTokens * kEpTopk));
  for (int64_t r = 0; r < kEpRanks; ++r) {
    for (int64_t t = 0; t < kEpTokens; ++t) {
      ids[r][t * 2] = static_cast<int32_t>((t + r) % 4);
      ids[r][t * 2 + 1] = static_cast<int32_t>((t + r + 1) % 4);
    }
  }
  return ids;
}

void ep_dispatch_bad_id(Arena& m, int64_t rank, int slot, int32_t id) {
  std::vector<std::vector<int32_t>> ids = ep_ids();
  ids[rank][slot] = id;
  EpRanks e;
  const sfmoe_status st =
      ep_dispatch(m, e, ids, SFMOE_EP_CAPACITY_WORST_CASE, SFMOE_EP_OVERFLOW_DROP);
  expect_outcome(m, st, SFMOE_ERROR_INVALID_ARGUMENT, 0, SFMOE_FAULT_BAD_INDEX);
  for (int64_t r = 0; r < kEpRanks; ++r) {
    expect_untouched_on_host(m, {e.received_data[r], e.handle_data[r], e.dropped_data[r]});
  }
}

void ep_dispatch_id_equal_to_experts(Arena& m) { ep_dispatch_bad_id(m, 1, 3, 4); }
void ep_dispatch_id_negative(Arena& m) { ep_dispatch_bad_id(m, 0, 8, -100); }
void ep_dispatch_id_named_twice(Arena& m) {
  std::vector<std::vector<int32_t>> ids = ep_ids();
  ids[0][5] = ids[0][4];
  EpRanks e;
  const sfmoe_status st =
      ep_dispatch(m, e, ids, SFMOE_EP_CAPACITY_WORST_CASE, SFMOE_EP_OVERFLOW_DROP);
  expect_outcome(m, st, SFMOE_ERROR_INVALID_ARGUMENT, 0, SFMOE_FAULT_BAD_INDEX);
}

// Every token of both ranks on expert 0 and 1 (rank 0) with a capacity of 5 rows and TRAP: the
// overflow raised on both backends, the drops counted exactly.
void ep_dispatch_trap_overflow(Arena& m) {
  std::vector<std::vector<int32_t>> ids(kEpRanks, std::vector<int32_t>(kEpTokens * kEpTopk));
  for (auto& rank : ids) {
    for (int64_t t = 0; t < kEpTokens; ++t) {
      rank[t * 2] = 0;
      rank[t * 2 + 1] = 1;
    }
  }
  EpRanks e;
  const sfmoe_status st = ep_dispatch(m, e, ids, 5, SFMOE_EP_OVERFLOW_TRAP);
  expect_outcome(m, st, SFMOE_SUCCESS, SFMOE_FAULT_EP_OVERFLOW, SFMOE_FAULT_EP_OVERFLOW);
  int64_t dropped = 0;
  for (int64_t r = 0; r < kEpRanks; ++r) {
    for (int64_t v : m.get<int64_t>(e.dropped_data[r], 4)) dropped += v;
  }
  EXPECT_EQ(dropped, kEpRanks * kEpTokens * kEpTopk - 5);
}

// Combine and combine's backward with a handle no dispatch wrote (random bytes): wrong rows are
// allowed, accesses outside the buffers are not (the guards, and memcheck on the device).
void ep_combine_garbage_handle(Arena& m) {
  EpRanks e;
  ASSERT_EQ(ep_dispatch(m, e, ep_ids(), SFMOE_EP_CAPACITY_WORST_CASE, SFMOE_EP_OVERFLOW_DROP),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  std::uniform_int_distribution<int64_t> any(std::numeric_limits<int64_t>::min(),
                                             std::numeric_limits<int64_t>::max());
  std::vector<sfmoe_tensor> handles, rows, probs, out, d_out, d_rows, d_probs;
  for (int64_t r = 0; r < kEpRanks; ++r) {
    std::vector<int64_t> junk(static_cast<size_t>(e.plan.handle_bytes / 8));
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = i % 3 == 0 ? any(rng()) : int64_t(i % 97);
    handles.push_back(tensor(m, m.in(junk), SFMOE_DTYPE_INT64, {e.plan.handle_bytes / 8}));
    rows.push_back(tensor(m, m.in(random_values(e.plan.receive_rows * kEpHidden)), SFMOE_DTYPE_FP32,
                          {e.plan.receive_rows, kEpHidden}));
    probs.push_back(tensor(m, m.in(random_values(kEpTokens * kEpTopk)), SFMOE_DTYPE_FP32,
                           {kEpTokens, kEpTopk}));
    out.push_back(
        tensor(m, m.out(kEpTokens * kEpHidden * 4), SFMOE_DTYPE_FP32, {kEpTokens, kEpHidden}));
    d_out.push_back(tensor(m, m.in(random_values(kEpTokens * kEpHidden)), SFMOE_DTYPE_FP32,
                           {kEpTokens, kEpHidden}));
    d_rows.push_back(tensor(m, m.out(static_cast<size_t>(e.plan.receive_rows * kEpHidden * 4)),
                            SFMOE_DTYPE_FP32, {e.plan.receive_rows, kEpHidden}));
    d_probs.push_back(
        tensor(m, m.out(kEpTokens * kEpTopk * 4), SFMOE_DTYPE_FP32, {kEpTokens, kEpTopk}));
  }
  auto ptrs = [](std::vector<sfmoe_tensor>& v) {
    std::vector<const sfmoe_tensor*> p;
    for (sfmoe_tensor& t : v) p.push_back(&t);
    return p;
  };
  auto p_h = ptrs(handles), p_rows = ptrs(rows), p_probs = ptrs(probs), p_out = ptrs(out),
       p_dout = ptrs(d_out), p_drows = ptrs(d_rows), p_dprobs = ptrs(d_probs);
  sfmoe_ep_combine_args c = sfmoe_ep_combine_args_init();
  c.rows = p_rows.data();
  c.probs = p_probs.data();
  c.handle = p_h.data();
  c.out = p_out.data();
  c.word = m.word();
  c.stream = m.stream();
  const sfmoe_status combined = sfmoe_ep_combine(e.group, &c);
  sfmoe_ep_combine_backward_args b = sfmoe_ep_combine_backward_args_init();
  b.d_out = p_dout.data();
  b.rows = p_rows.data();
  b.probs = p_probs.data();
  b.handle = p_h.data();
  b.d_rows = p_drows.data();
  b.d_probs = p_dprobs.data();
  b.word = m.word();
  b.stream = m.stream();
  const sfmoe_status backward = sfmoe_ep_combine_backward(e.group, &b);
  // Either refused or carried out; never outside the buffers (checked by the harness).
  EXPECT_TRUE(combined == SFMOE_SUCCESS || combined == SFMOE_ERROR_INVALID_ARGUMENT)
      << sfmoe_last_error();
  EXPECT_TRUE(backward == SFMOE_SUCCESS || backward == SFMOE_ERROR_INVALID_ARGUMENT)
      << sfmoe_last_error();
  m.sync_now();
}

}  // namespace

const std::vector<AdversarialCase>& adversarial_cases() {
  static const std::vector<AdversarialCase> cases = {
      {"OffsetsNegative", offsets_negative},
      {"OffsetsInt64Min", offsets_int64_min},
      {"OffsetsInt64MaxLast", offsets_int64_max_last},
      {"QuantizeTensorDecreasing", quantize_tensor_decreasing},
      {"QuantizeTensorOverCapacity", quantize_tensor_over_capacity},
      {"QuantizeBlockNegative", quantize_block_negative},
      {"QuantizeMxSwizzledOverCapacity", quantize_mx_swizzled_over_capacity},
      {"QuantizeNvfp4StartNotZero", quantize_nvfp4_start_not_zero},
      {"QuantizeNanAmaxTrapped", quantize_nan_amax_trapped},
      {"QuantizeGivenScalesNanInf", quantize_given_scales_nan_inf},
      {"QuantizeGivenAmaxNanTrapped", quantize_given_amax_nan_trapped},
      {"AmaxOverCapacity", amax_over_capacity},
      {"GemmFpropDecreasing", gemm_fprop_decreasing},
      {"GemmFpropOverCapacity", gemm_fprop_over_capacity},
      {"GemmDgradNegative", gemm_dgrad_negative},
      {"GemmDgradInt64Max", gemm_dgrad_int64_max},
      {"GemmWgradOverCapacity", gemm_wgrad_over_capacity},
      {"GemmWgradAccumulateStartNotZero", gemm_wgrad_accumulate_start_not_zero},
      {"ActivationRowsBeyondBlock", activation_rows_beyond_block},
      {"ActivationRowsNegative", activation_rows_negative},
      {"ActivationOffsetsDecreasing", activation_offsets_decreasing},
      {"ActivationOffsetsMisaligned", activation_offsets_misaligned},
      {"ActivationBackwardRowsBeyondBlock", activation_backward_rows_beyond_block},
      {"ActivationBackwardOverCapacity", activation_backward_over_capacity},
      {"ActivationFusedMxRowsBeyondBlock", activation_fused_mx_rows_beyond_block},
      {"PermuteIdEqualToExperts", permute_id_equal_to_experts},
      {"PermuteIdNegative", permute_id_negative},
      {"PermuteIdInt32MinFusedMx", permute_id_int32_min_fused_mx},
      {"PermuteIdLargeWithCapacity", permute_id_large_with_capacity},
      {"PermuteIdNamedTwice", permute_id_named_twice},
      {"UnpermuteRowBeyondCapacity", unpermute_row_beyond_capacity},
      {"UnpermuteRowNegative", unpermute_row_negative},
      {"UnpermuteRowInt64Min", unpermute_row_int64_min},
      {"UnpermuteNanInfProbs", unpermute_nan_inf_probs},
      {"UnpermuteBackwardRowBeyondCapacity", unpermute_backward_row_beyond_capacity},
      {"UnpermuteBackwardRowNegative", unpermute_backward_row_negative},
      {"UnpermuteBackwardGroupRowsBeyondBlock", unpermute_backward_group_rows_beyond_block},
      {"RouterBackwardIdEqualToExperts", router_backward_id_equal_to_experts},
      {"RouterBackwardIdNegative", router_backward_id_negative},
      {"RouterForwardNonFinite", router_forward_nonfinite},
      {"EpDispatchIdEqualToExperts", ep_dispatch_id_equal_to_experts},
      {"EpDispatchIdNegative", ep_dispatch_id_negative},
      {"EpDispatchIdNamedTwice", ep_dispatch_id_named_twice},
      {"EpDispatchTrapOverflow", ep_dispatch_trap_overflow},
      {"EpCombineGarbageHandle", ep_combine_garbage_handle},
  };
  return cases;
}

}  // namespace testing
}  // namespace sfmoe

// The determinism cases (tests/cpp/determinism_cases.h).
#include "tests/cpp/determinism_cases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "sfmoe/activation.h"
#include "sfmoe/cast.h"
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

// Inputs from the seed: normal values with special ones (±0, a subnormal, a large value).
struct Draw {
  std::mt19937 rng;
  explicit Draw(uint32_t seed) : rng(seed) {}
  std::vector<float> floats(size_t n, float sigma = 1.0f) {
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    if (n > 8) {
      v[1] = -0.0f;
      v[3] = 1e-39f;
      v[5] = 60.0f;
    }
    return v;
  }
  std::vector<uint16_t> bf16(size_t n, float sigma = 1.0f) {
    std::vector<uint16_t> v(n);
    const std::vector<float> f = floats(n, sigma);
    for (size_t i = 0; i < n; ++i) v[i] = numerics::f32_to_bf16(f[i]);
    return v;
  }
  // Each token's k distinct experts, skewed towards the low ids (some experts stay empty).
  std::vector<int32_t> ids(int64_t tokens, int64_t k, int64_t experts) {
    std::vector<int32_t> v(static_cast<size_t>(tokens * k));
    std::geometric_distribution<int32_t> skew(4.0 / static_cast<double>(experts));
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < k; ++i) {
        int32_t e;
        bool fresh;
        do {
          e = std::min<int32_t>(skew(rng), static_cast<int32_t>(experts - 1));
          if (rng() % 4 == 0) e = static_cast<int32_t>(rng() % experts);
          fresh = std::find(&v[t * k], &v[t * k + i], e) == &v[t * k + i];
        } while (!fresh);
        v[t * k + i] = e;
      }
    }
    return v;
  }
  // num_groups + 1 offsets over `rows`, group starts multiples of `alignment`, some groups
  // empty; the real rows of each group in *real.
  std::vector<int64_t> offsets(int64_t groups, int64_t rows, int64_t alignment,
                               std::vector<int64_t>* real = nullptr) {
    std::vector<int64_t> off(static_cast<size_t>(groups + 1), 0);
    if (real) real->assign(static_cast<size_t>(groups), 0);
    int64_t at = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t left = rows - at;
      const int64_t want =
          rng() % 5 == 0 ? 0 : static_cast<int64_t>(rng() % (2 * rows / groups + 1));
      const int64_t n = std::min(want, std::max<int64_t>(0, left - alignment));
      if (real) (*real)[g] = n;
      at += (n + alignment - 1) / alignment * alignment;
      off[g + 1] = at;
    }
    return off;
  }
};

std::vector<uint8_t> bytes(Arena& m, const void* p, size_t n) { return m.get<uint8_t>(p, n); }

// A planned grouped tensor carved out of one arena buffer.
struct Planned {
  sfmoe_grouped_tensor t{};
  void* base = nullptr;
  size_t total = 0;
};

Planned bind(Arena& m, const sfmoe_grouped_tensor_plan& plan) {
  Planned p;
  p.total = static_cast<size_t>(plan.total_bytes);
  p.base = m.out(p.total, 0x5A);
  EXPECT_EQ(sfmoe_grouped_tensor_bind(&plan, m.memory(), 0, p.base, &p.t), SFMOE_SUCCESS)
      << sfmoe_last_error();
  return p;
}

sfmoe_tensor workspace(Arena& m, int64_t bytes) {
  const int64_t b = std::max<int64_t>(16, bytes);
  return tensor(m, m.out(static_cast<size_t>(b)), SFMOE_DTYPE_INT64, {(b + 7) / 8});
}

// ---- router
// ----------------------------------------------------------------------------------------

OutputBytes router(Arena& m, uint32_t seed, bool sigmoid) {
  Draw draw(seed);
  const int64_t T = m.on_device() ? 4099 : 301, E = 64, k = 8;
  const sfmoe_tensor logits = tensor(m, m.in(draw.floats(T * E, 2.0f)), SFMOE_DTYPE_FP32, {T, E});
  const sfmoe_tensor bias = tensor(m, m.in(draw.floats(E, 0.1f)), SFMOE_DTYPE_FP32, {E});
  void* ids = m.out(T * k * 4);
  void* probs = m.out(T * k * 4);
  void* counts = m.out(E * 8);
  void* aux = m.out(4);
  void* z = m.out(4);
  void* d_logits = m.out(T * E * 4);
  const sfmoe_tensor t_ids = tensor(m, ids, SFMOE_DTYPE_INT32, {T, k});
  const sfmoe_tensor t_probs = tensor(m, probs, SFMOE_DTYPE_FP32, {T, k});
  const sfmoe_tensor t_counts = tensor(m, counts, SFMOE_DTYPE_INT64, {E});
  const sfmoe_tensor t_aux = tensor(m, aux, SFMOE_DTYPE_FP32, {1});
  const sfmoe_tensor t_z = tensor(m, z, SFMOE_DTYPE_FP32, {1});
  const sfmoe_tensor ws = workspace(m, sfmoe_router_workspace_bytes(T, E));
  sfmoe_router_config c = sfmoe_router_config_init();
  c.top_k = k;
  c.aux_loss_coeff = 0.01f;
  c.z_loss_coeff = 0.001f;
  if (sigmoid) {
    c.score = SFMOE_ROUTER_SCORE_SIGMOID;
    c.normalize = 1;
    c.num_groups = 8;
    c.group_topk = 4;
    c.scaling_factor = 2.5f;
  }
  EXPECT_EQ(sfmoe_router_forward(&logits, sigmoid ? &bias : nullptr, &c, &t_ids, &t_probs,
                                 &t_counts, &t_aux, &t_z, &ws, m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  const sfmoe_tensor d_probs = tensor(m, m.in(draw.floats(T * k)), SFMOE_DTYPE_FP32, {T, k});
  const sfmoe_tensor t_dl = tensor(m, d_logits, SFMOE_DTYPE_FP32, {T, E});
  EXPECT_EQ(sfmoe_router_backward(&logits, &t_ids, &t_counts, &c, &d_probs, 1.0f, 1.0f, &t_dl,
                                  nullptr, m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  return {bytes(m, ids, T * k * 4), bytes(m, probs, T * k * 4),
          bytes(m, counts, E * 8),  bytes(m, aux, 4),
          bytes(m, z, 4),           bytes(m, d_logits, T * E * 4)};
}

OutputBytes router_softmax(Arena& m, uint32_t seed) { return router(m, seed, false); }
OutputBytes router_sigmoid_grouped(Arena& m, uint32_t seed) { return router(m, seed, true); }

// ---- permute, unpermute and their backward
// ------------------------------------------------------------

OutputBytes permute_chain(Arena& m, uint32_t seed, sfmoe_scaling fused, int64_t capacity) {
  Draw draw(seed);
  const int64_t T = m.on_device() ? 3001 : 203, E = 48, k = 6, H = 256;
  const bool quantized = fused != SFMOE_SCALING_NONE;
  sfmoe_permute_plan_request req = sfmoe_permute_plan_request_init();
  req.num_tokens = T;
  req.topk = k;
  req.num_experts = E;
  req.hidden = H;
  req.row_alignment = quantized ? 128 : 16;
  req.expert_capacity = capacity;
  req.dtype = quantized ? SFMOE_DTYPE_FP8_E4M3 : SFMOE_DTYPE_BF16;
  req.scaling = fused;
  req.group_amax = !quantized;
  sfmoe_permute_plan plan;
  plan.struct_size = sizeof(plan);
  plan.permuted.struct_size = sizeof(plan.permuted);
  EXPECT_EQ(sfmoe_plan_permute(&req, &plan), SFMOE_SUCCESS) << sfmoe_last_error();
  Planned permuted = bind(m, plan.permuted);
  const sfmoe_tensor tokens = tensor(m, m.in(draw.bf16(T * H)), SFMOE_DTYPE_BF16, {T, H});
  const sfmoe_tensor ids = tensor(m, m.in(draw.ids(T, k, E)), SFMOE_DTYPE_INT32, {T, k});
  void* map = m.out(T * k * 8);
  void* kept = m.out(E * 8);
  void* dropped = m.out(E * 8);
  const sfmoe_tensor t_map = tensor(m, map, SFMOE_DTYPE_INT64, {T, k});
  const sfmoe_tensor t_kept = tensor(m, kept, SFMOE_DTYPE_INT64, {E});
  const sfmoe_tensor t_dropped = tensor(m, dropped, SFMOE_DTYPE_INT64, {E});
  const sfmoe_tensor ws = workspace(m, plan.workspace.bytes);
  sfmoe_permute_config config = sfmoe_permute_config_init();
  config.expert_capacity = capacity;
  EXPECT_EQ(sfmoe_permute(&tokens, &ids, &config, &permuted.t, &t_map, &t_kept, &t_dropped, &ws,
                          nullptr, m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  OutputBytes out = {bytes(m, permuted.base, permuted.total), bytes(m, map, T * k * 8),
                     bytes(m, kept, E * 8), bytes(m, dropped, E * 8)};
  if (quantized) return out;
  // Unpermute of the permuted rows with probabilities, and both backward calls.
  const sfmoe_tensor probs = tensor(m, m.in(draw.floats(T * k)), SFMOE_DTYPE_FP32, {T, k});
  void* combined = m.out(T * H * 2);
  const sfmoe_tensor t_combined = tensor(m, combined, SFMOE_DTYPE_BF16, {T, H});
  EXPECT_EQ(sfmoe_unpermute(&permuted.t, &t_map, &probs, &t_combined, nullptr, m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  const sfmoe_tensor d_out = tensor(m, m.in(draw.bf16(T * H)), SFMOE_DTYPE_BF16, {T, H});
  Planned d_rows = bind(m, plan.permuted);
  d_rows.t.group_offsets = permuted.t.group_offsets;
  d_rows.t.amax = nullptr;
  void* d_probs = m.out(T * k * 4);
  const sfmoe_tensor t_dprobs = tensor(m, d_probs, SFMOE_DTYPE_FP32, {T, k});
  EXPECT_EQ(sfmoe_unpermute_backward(&d_out, &permuted.t, &t_map, &probs, &t_kept, &d_rows.t,
                                     &t_dprobs, nullptr, m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  void* d_tokens = m.out(T * H * 4);
  const sfmoe_tensor t_dtokens = tensor(m, d_tokens, SFMOE_DTYPE_FP32, {T, H});
  EXPECT_EQ(sfmoe_unpermute(&d_rows.t, &t_map, nullptr, &t_dtokens, nullptr, m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  out.push_back(bytes(m, combined, T * H * 2));
  out.push_back(bytes(m, d_rows.base, d_rows.total));
  out.push_back(bytes(m, d_probs, T * k * 4));
  out.push_back(bytes(m, d_tokens, T * H * 4));
  return out;
}

OutputBytes permute_bf16(Arena& m, uint32_t seed) {
  return permute_chain(m, seed, SFMOE_SCALING_NONE, 0);
}
OutputBytes permute_bf16_capacity(Arena& m, uint32_t seed) {
  return permute_chain(m, seed, SFMOE_SCALING_NONE, m.on_device() ? 300 : 20);
}
OutputBytes permute_fused_block(Arena& m, uint32_t seed) {
  return permute_chain(m, seed, SFMOE_SCALING_BLOCK_1X128, 0);
}
OutputBytes permute_fused_mx(Arena& m, uint32_t seed) {
  return permute_chain(m, seed, SFMOE_SCALING_MX_1X32, 0);
}

// ---- grouped quantization, amax and dequantization
// ------------------------------------------------------

OutputBytes quantize(Arena& m, uint32_t seed, sfmoe_scaling scaling, sfmoe_scale_layout layout,
                     bool columnwise, bool stochastic_hadamard) {
  Draw draw(seed);
  const int64_t G = 24, R = m.on_device() ? 6144 : 3072, C = 256;  // 128x128 weights: R / G = 128k
  const bool weights = scaling == SFMOE_SCALING_BLOCK_128X128;
  const std::vector<int64_t> offsets = draw.offsets(G, R, 1);
  int64_t* off = m.in(offsets);
  sfmoe_grouped_tensor input =
      rows_in(m.memory(), m.in(draw.bf16(R * C, 3.0f)), SFMOE_DTYPE_BF16, G, R, C, 1, off);
  if (weights) {
    input.group_offsets = nullptr;
    input.uniform_group_rows = R / G;
  }
  sfmoe_quantize_plan_request req = sfmoe_quantize_plan_request_init();
  req.dtype = scaling == SFMOE_SCALING_NV_1X16 ? SFMOE_DTYPE_FP4_E2M1 : SFMOE_DTYPE_FP8_E4M3;
  req.scaling = scaling;
  req.scale_layout = layout;
  req.rowwise = 1;
  req.columnwise = columnwise;
  req.hadamard_columnwise = stochastic_hadamard;
  req.num_groups = G;
  req.cols = C;
  req.input_rows = R;
  req.uniform_group_rows = weights ? R / G : 0;
  sfmoe_grouped_tensor_plan plan;
  plan.struct_size = sizeof(plan);
  EXPECT_EQ(sfmoe_plan_grouped_quantize(&req, &plan), SFMOE_SUCCESS) << sfmoe_last_error();
  Planned q = bind(m, plan);
  sfmoe_quantize_config config = sfmoe_quantize_config_init();
  config.stochastic_rounding = stochastic_hadamard;
  config.hadamard_columnwise = stochastic_hadamard;
  config.seed = seed;
  config.offset = 12345;
  EXPECT_EQ(sfmoe_grouped_quantize(&input, &q.t, &config, nullptr, m.stream()), SFMOE_SUCCESS)
      << sfmoe_last_error();
  OutputBytes out = {bytes(m, q.base, q.total)};
  if (!weights) {
    float* amax = static_cast<float*>(m.out(G * 4));
    EXPECT_EQ(sfmoe_grouped_amax(&input, amax, nullptr, m.stream()), SFMOE_SUCCESS)
        << sfmoe_last_error();
    out.push_back(bytes(m, amax, G * 4));
  }
  void* back = m.out(static_cast<size_t>(q.t.row_capacity * C * 4));
  sfmoe_grouped_tensor dq = q.t;
  dq.dtype = SFMOE_DTYPE_FP32;
  dq.scaling = SFMOE_SCALING_NONE;
  dq.scale_layout = SFMOE_SCALE_LAYOUT_COMPACT;
  dq.rowwise_data = back;
  dq.rowwise_scale_inv = dq.columnwise_data = dq.columnwise_scale_inv = nullptr;
  dq.amax = dq.columnwise_amax = nullptr;
  for (sfmoe_dequantize_source source : {SFMOE_DEQUANTIZE_ROWWISE, SFMOE_DEQUANTIZE_COLUMNWISE}) {
    if (source == SFMOE_DEQUANTIZE_COLUMNWISE && !columnwise) continue;
    EXPECT_EQ(sfmoe_grouped_dequantize(&q.t, &dq, source, &config, m.stream()), SFMOE_SUCCESS)
        << sfmoe_last_error();
    out.push_back(bytes(m, back, static_cast<size_t>(q.t.row_capacity * C * 4)));
  }
  return out;
}

OutputBytes quantize_tensor(Arena& m, uint32_t seed) {
  return quantize(m, seed, SFMOE_SCALING_TENSOR, SFMOE_SCALE_LAYOUT_COMPACT, true, false);
}
OutputBytes quantize_block_1x128(Arena& m, uint32_t seed) {
  return quantize(m, seed, SFMOE_SCALING_BLOCK_1X128, SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED,
                  true, false);
}
OutputBytes quantize_block_128x128_weights(Arena& m, uint32_t seed) {
  return quantize(m, seed, SFMOE_SCALING_BLOCK_128X128, SFMOE_SCALE_LAYOUT_COMPACT, true, false);
}
OutputBytes quantize_mx_swizzled(Arena& m, uint32_t seed) {
  return quantize(m, seed, SFMOE_SCALING_MX_1X32, SFMOE_SCALE_LAYOUT_SWIZZLED, true, false);
}
OutputBytes quantize_nvfp4_stochastic_hadamard(Arena& m, uint32_t seed) {
  return quantize(m, seed, SFMOE_SCALING_NV_1X16, SFMOE_SCALE_LAYOUT_COMPACT, true, true);
}

// ---- grouped GEMM, the three forms
// ---------------------------------------------------------------------

OutputBytes gemm(Arena& m, uint32_t seed, sfmoe_gemm_form form, bool accumulate) {
  Draw draw(seed);
  const int64_t G = m.on_device() ? 16 : 6, R = m.on_device() ? 8192 : 600;
  const int64_t K = m.on_device() ? 768 : 96, N = m.on_device() ? 1024 : 64;
  int64_t* off = m.in(draw.offsets(G, R, 8));
  const int64_t a_cols = form == SFMOE_GEMM_FPROP ? K : N;
  const sfmoe_grouped_tensor a =
      rows_in(m.memory(), m.in(draw.bf16(R * a_cols)), SFMOE_DTYPE_BF16, G, R, a_cols, 8, off);
  sfmoe_grouped_tensor b{}, out{};
  void* out_data = nullptr;
  size_t out_bytes = 0;
  if (form == SFMOE_GEMM_WGRAD) {
    b = rows_in(m.memory(), m.in(draw.bf16(R * K)), SFMOE_DTYPE_BF16, G, R, K, 8, off);
    const sfmoe_dtype dt = accumulate ? SFMOE_DTYPE_FP32 : SFMOE_DTYPE_BF16;
    out_bytes = static_cast<size_t>(G * N * K) * (accumulate ? 4 : 2);
    if (accumulate) {
      const std::vector<float> start = draw.floats(static_cast<size_t>(G * N * K));
      out_data = m.out_init(start);
    } else {
      out_data = m.out(out_bytes);
    }
    out = rows_in(m.memory(), out_data, dt, G, G * N, K, 1, nullptr);
    out.uniform_group_rows = N;
  } else {
    b = rows_in(m.memory(), m.in(draw.bf16(G * N * K, 0.05f)), SFMOE_DTYPE_BF16, G, G * N, K, 1,
                nullptr);
    b.uniform_group_rows = N;
    const int64_t out_cols = form == SFMOE_GEMM_FPROP ? N : K;
    out_bytes = static_cast<size_t>(R * out_cols * 2);
    out_data = m.out(out_bytes);
    out = rows_in(m.memory(), out_data, SFMOE_DTYPE_BF16, G, R, out_cols, 8, off);
  }
  const sfmoe_tensor ws =
      workspace(m, sfmoe_grouped_gemm_workspace_bytes(G, SFMOE_SCALING_NONE, a.row_capacity, a.cols,
                                                      SFMOE_SCALING_NONE, b.row_capacity, b.cols));
  sfmoe_grouped_gemm_config c = sfmoe_grouped_gemm_config_init();
  c.form = form;
  c.accumulate = accumulate;
  EXPECT_EQ(sfmoe_grouped_gemm(&a, &b, &c, &out, &ws, nullptr, m.stream()), SFMOE_SUCCESS)
      << sfmoe_last_error();
  return {bytes(m, out_data, out_bytes)};
}

OutputBytes gemm_fprop(Arena& m, uint32_t seed) { return gemm(m, seed, SFMOE_GEMM_FPROP, false); }
OutputBytes gemm_dgrad(Arena& m, uint32_t seed) { return gemm(m, seed, SFMOE_GEMM_DGRAD, false); }
OutputBytes gemm_wgrad(Arena& m, uint32_t seed) { return gemm(m, seed, SFMOE_GEMM_WGRAD, false); }
OutputBytes gemm_wgrad_accumulate(Arena& m, uint32_t seed) {
  return gemm(m, seed, SFMOE_GEMM_WGRAD, true);
}

// ---- grouped activation, forward (plain and fused MXFP8) and backward
// ------------------------------------

OutputBytes activation(Arena& m, uint32_t seed, sfmoe_activation kind) {
  Draw draw(seed);
  const int64_t G = 20, R = m.on_device() ? 8192 : 640, F = 256;
  const bool gated = kind == SFMOE_ACTIVATION_SWIGLU || kind == SFMOE_ACTIVATION_GEGLU ||
                     kind == SFMOE_ACTIVATION_CLAMPED_SWIGLU;
  const int64_t in_cols = gated ? 2 * F : F;
  std::vector<int64_t> real;
  int64_t* off = m.in(draw.offsets(G, R, 32, &real));
  const sfmoe_tensor rows = tensor(m, m.in(real), SFMOE_DTYPE_INT64, {G});
  const sfmoe_grouped_tensor input = rows_in(m.memory(), m.in(draw.bf16(R * in_cols, 2.0f)),
                                             SFMOE_DTYPE_BF16, G, R, in_cols, 32, off);
  sfmoe_activation_config config = sfmoe_activation_config_init();
  config.kind = kind;
  OutputBytes out;
  for (int fused = 0; fused < 2; ++fused) {
    sfmoe_activation_plan_request req = sfmoe_activation_plan_request_init();
    req.kind = kind;
    req.num_groups = G;
    req.row_capacity = R;
    req.input_cols = in_cols;
    req.row_alignment = 32;
    req.dtype = fused ? SFMOE_DTYPE_FP8_E4M3 : SFMOE_DTYPE_BF16;
    req.scaling = fused ? SFMOE_SCALING_MX_1X32 : SFMOE_SCALING_NONE;
    req.group_amax = 1;
    sfmoe_grouped_tensor_plan plan;
    plan.struct_size = sizeof(plan);
    EXPECT_EQ(sfmoe_plan_grouped_activation(&req, &plan), SFMOE_SUCCESS) << sfmoe_last_error();
    Planned y = bind(m, plan);
    EXPECT_EQ(sfmoe_grouped_activation(&input, &rows, &config, &y.t, nullptr, m.stream()),
              SFMOE_SUCCESS)
        << sfmoe_last_error();
    out.push_back(bytes(m, y.base, y.total));
  }
  const sfmoe_grouped_tensor d_out =
      rows_in(m.memory(), m.in(draw.bf16(R * F)), SFMOE_DTYPE_BF16, G, R, F, 32, off);
  void* d_in = m.out(static_cast<size_t>(R * in_cols * 4));
  const sfmoe_grouped_tensor t_din =
      rows_in(m.memory(), d_in, SFMOE_DTYPE_FP32, G, R, in_cols, 32, off);
  EXPECT_EQ(sfmoe_grouped_activation_backward(&input, &rows, &d_out, &config, &t_din, nullptr,
                                              m.stream()),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  out.push_back(bytes(m, d_in, static_cast<size_t>(R * in_cols * 4)));
  return out;
}

OutputBytes activation_swiglu(Arena& m, uint32_t seed) {
  return activation(m, seed, SFMOE_ACTIVATION_SWIGLU);
}
OutputBytes activation_squared_relu(Arena& m, uint32_t seed) {
  return activation(m, seed, SFMOE_ACTIVATION_SQUARED_RELU);
}

// ---- cast
// --------------------------------------------------------------------------------------------

OutputBytes cast(Arena& m, uint32_t seed) {
  Draw draw(seed);
  const int64_t n = m.on_device() ? (1 << 20) + 6 : 4102;
  const sfmoe_tensor in = tensor(m, m.in(draw.floats(n, 50.0f)), SFMOE_DTYPE_FP32, {n});
  OutputBytes out;
  for (sfmoe_dtype dt : {SFMOE_DTYPE_BF16, SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_FP4_E2M1}) {
    const size_t b =
        static_cast<size_t>(dt == SFMOE_DTYPE_FP4_E2M1 ? n / 2 : n * sfmoe_dtype_bits(dt) / 8);
    void* o = m.out(b);
    const sfmoe_tensor t = tensor(m, o, dt, {n});
    sfmoe_cast_config c = sfmoe_cast_config_init();
    c.scale = 0.25f;
    EXPECT_EQ(sfmoe_cast(&in, &t, &c, m.stream()), SFMOE_SUCCESS) << sfmoe_last_error();
    out.push_back(bytes(m, o, b));
  }
  return out;
}

// ---- expert parallelism (loopback): dispatch, combine, combine's backward
// ----------------------------

OutputBytes ep_loopback(Arena& m, uint32_t seed, sfmoe_ep_overflow overflow) {
  Draw draw(seed);
  const int32_t R = 4;
  const int64_t El = 8, E = R * El, T = m.on_device() ? 1024 : 96, k = 4, H = 128;
  sfmoe_ep_config c = sfmoe_ep_config_init();
  c.world_size = R;
  c.experts_per_rank = El;
  c.max_tokens_per_rank = T;
  c.top_k = k;
  c.hidden = H;
  c.payload = SFMOE_DTYPE_BF16;
  c.row_alignment = 16;
  c.overflow = overflow;
  if (overflow == SFMOE_EP_OVERFLOW_SPILL) {
    c.receive_capacity = T * k / 2;
    c.spill_capacity = T * k / 4;
  }
  sfmoe_ep_group* group = nullptr;
  EXPECT_EQ(sfmoe_ep_group_create(&c, m.memory(), 0, &group), SFMOE_SUCCESS) << sfmoe_last_error();
  if (group == nullptr) return {};
  sfmoe_ep_plan plan = sfmoe_ep_plan_init();
  EXPECT_EQ(sfmoe_ep_group_get_plan(group, &plan), SFMOE_SUCCESS);
  const int64_t rows = plan.receive_rows, G = plan.rounds * El;
  std::vector<sfmoe_tensor> tokens, ids, received, offsets, handle, kept, dropped, probs, out,
      d_out, d_rows, d_probs;
  std::vector<void*> outputs;
  std::vector<size_t> sizes;
  auto output = [&](size_t b) {
    void* p = m.out(b);
    outputs.push_back(p);
    sizes.push_back(b);
    return p;
  };
  for (int r = 0; r < R; ++r) {
    tokens.push_back(tensor(m, m.in(draw.bf16(T * H)), SFMOE_DTYPE_BF16, {T, H}));
    ids.push_back(tensor(m, m.in(draw.ids(T, k, E)), SFMOE_DTYPE_INT32, {T, k}));
    received.push_back(tensor(m, output(rows * H * 2), SFMOE_DTYPE_BF16, {rows, H}));
    offsets.push_back(
        tensor(m, output(8 * plan.rounds * (El + 1)), SFMOE_DTYPE_INT64, {plan.rounds * (El + 1)}));
    handle.push_back(tensor(m, output(static_cast<size_t>(plan.handle_bytes)), SFMOE_DTYPE_INT64,
                            {plan.handle_bytes / 8}));
    kept.push_back(tensor(m, output(8 * G), SFMOE_DTYPE_INT64, {G}));
    dropped.push_back(tensor(m, output(8 * E), SFMOE_DTYPE_INT64, {E}));
    probs.push_back(tensor(m, m.in(draw.floats(T * k)), SFMOE_DTYPE_FP32, {T, k}));
    out.push_back(tensor(m, output(T * H * 2), SFMOE_DTYPE_BF16, {T, H}));
    d_out.push_back(tensor(m, m.in(draw.bf16(T * H)), SFMOE_DTYPE_BF16, {T, H}));
    d_rows.push_back(tensor(m, output(rows * H * 2), SFMOE_DTYPE_BF16, {rows, H}));
    d_probs.push_back(tensor(m, output(T * k * 4), SFMOE_DTYPE_FP32, {T, k}));
  }
  auto ptrs = [](std::vector<sfmoe_tensor>& v) {
    std::vector<const sfmoe_tensor*> p;
    for (sfmoe_tensor& t : v) p.push_back(&t);
    return p;
  };
  auto p_tokens = ptrs(tokens), p_ids = ptrs(ids), p_received = ptrs(received),
       p_offsets = ptrs(offsets), p_handle = ptrs(handle), p_kept = ptrs(kept),
       p_dropped = ptrs(dropped), p_probs = ptrs(probs), p_out = ptrs(out), p_dout = ptrs(d_out),
       p_drows = ptrs(d_rows), p_dprobs = ptrs(d_probs);
  sfmoe_ep_dispatch_args d = sfmoe_ep_dispatch_args_init();
  d.tokens = p_tokens.data();
  d.topk_ids = p_ids.data();
  d.received = p_received.data();
  d.group_offsets = p_offsets.data();
  d.handle = p_handle.data();
  d.tokens_per_expert = p_kept.data();
  d.dropped_per_expert = p_dropped.data();
  d.stream = m.stream();
  EXPECT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_SUCCESS) << sfmoe_last_error();
  sfmoe_ep_combine_args cb = sfmoe_ep_combine_args_init();
  cb.rows = p_received.data();
  cb.probs = p_probs.data();
  cb.handle = p_handle.data();
  cb.out = p_out.data();
  cb.stream = m.stream();
  EXPECT_EQ(sfmoe_ep_combine(group, &cb), SFMOE_SUCCESS) << sfmoe_last_error();
  sfmoe_ep_combine_backward_args bw = sfmoe_ep_combine_backward_args_init();
  bw.d_out = p_dout.data();
  bw.rows = p_received.data();
  bw.probs = p_probs.data();
  bw.handle = p_handle.data();
  bw.d_rows = p_drows.data();
  bw.d_probs = p_dprobs.data();
  bw.stream = m.stream();
  EXPECT_EQ(sfmoe_ep_combine_backward(group, &bw), SFMOE_SUCCESS) << sfmoe_last_error();
  OutputBytes result;
  for (size_t i = 0; i < outputs.size(); ++i) result.push_back(bytes(m, outputs[i], sizes[i]));
  sfmoe_ep_group_destroy(group);
  return result;
}

OutputBytes ep_drop(Arena& m, uint32_t seed) {
  return ep_loopback(m, seed, SFMOE_EP_OVERFLOW_DROP);
}
OutputBytes ep_spill(Arena& m, uint32_t seed) {
  return ep_loopback(m, seed, SFMOE_EP_OVERFLOW_SPILL);
}

}  // namespace

const std::vector<DeterminismCase>& determinism_cases() {
  static const std::vector<DeterminismCase> cases = {
      {"RouterSoftmaxLosses", router_softmax},
      {"RouterSigmoidGroupLimited", router_sigmoid_grouped},
      {"PermuteUnpermuteBf16", permute_bf16},
      {"PermuteUnpermuteBf16Capacity", permute_bf16_capacity},
      {"PermuteFusedBlock1x128", permute_fused_block},
      {"PermuteFusedMx", permute_fused_mx},
      {"QuantizeTensor", quantize_tensor},
      {"QuantizeBlock1x128", quantize_block_1x128},
      {"QuantizeBlock128x128Weights", quantize_block_128x128_weights},
      {"QuantizeMxSwizzled", quantize_mx_swizzled},
      {"QuantizeNvfp4StochasticHadamard", quantize_nvfp4_stochastic_hadamard},
      {"GemmFprop", gemm_fprop},
      {"GemmDgrad", gemm_dgrad},
      {"GemmWgrad", gemm_wgrad},
      {"GemmWgradAccumulate", gemm_wgrad_accumulate},
      {"ActivationSwiglu", activation_swiglu},
      {"ActivationSquaredRelu", activation_squared_relu},
      {"Cast", cast},
      {"EpLoopbackDrop", ep_drop},
      {"EpLoopbackSpill", ep_spill},
  };
  return cases;
}

}  // namespace testing
}  // namespace sfmoe

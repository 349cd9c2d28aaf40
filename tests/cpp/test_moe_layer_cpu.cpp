// The MoE layer on the CPU backend against the dense double-precision reference
// (tests/cpp/moe_layer_reference.h): output, every gradient, the expert counts; and its refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>

#include "sfmoe/moe_layer.h"
#include "tests/cpp/moe_layer_reference.h"
#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace testing {
namespace {

constexpr sfmoe_dtype kBytes = SFMOE_DTYPE_FP8_E4M3;  // a one-byte dtype for plain buffers

struct HostLayerRun {
  std::vector<uint8_t> y, d_x, d_w1, d_w2;
  std::vector<float> d_logits, aux;
  std::vector<int64_t> kept, dropped;
  std::vector<double> d_w1_start, d_w2_start;  // accumulate: the main gradients before
};

// How run_on_host calls the backward (sfmoe_moe_backward_part).
enum class Backward {
  kWhole,
  kTwoParts,   // FC2 then FC1, the FC1 part on a fresh workspace of its own size (so it cannot
               // lean on what the FC2 part left there)
  kThreeParts  // FC2_DGRAD, FC1, FC2_WGRAD on one workspace; `saved` scribbled over before
               // FC2_WGRAD, which is handed neither it nor w2
};

// A weight cache handed to both calls (sfmoe_moe_forward_args.weight_cache), sized to the plan
// when empty, and each call's filled flag.
struct WeightCacheUse {
  std::vector<uint8_t>* cache;
  bool forward_filled, backward_filled;
};

// Forward and backward of `p` on the host; false (with the message) when a call fails.
// backward: how the backward is called (above). rng_offset, rng_offset_device: the
// backward's NVFP4 rounding offsets (offset_dtype: the device offset's declared dtype). With
// backward_status the backward's status is stored there instead of expected to be success.
bool run_on_host(const LayerProblem& p, std::mt19937_64& rng, HostLayerRun* run,
                 Backward backward = Backward::kWhole, uint64_t rng_offset = 0,
                 void* rng_offset_device = nullptr, sfmoe_dtype offset_dtype = SFMOE_DTYPE_INT64,
                 sfmoe_status* backward_status = nullptr, const WeightCacheUse* cache = nullptr) {
  const LayerCase& c = p.c;
  const int64_t T = c.tokens, H = c.hidden, E = c.experts;
  sfmoe_moe_layer_config config = layer_config(c);
  sfmoe_moe_layer* layer = nullptr;
  EXPECT_EQ(sfmoe_moe_layer_create(&config, SFMOE_MEMORY_HOST, 0, &layer), SFMOE_SUCCESS)
      << sfmoe_last_error();
  if (layer == nullptr) return false;
  sfmoe_moe_layer_plan plan = sfmoe_moe_layer_plan_init();
  EXPECT_EQ(sfmoe_moe_layer_get_plan(layer, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.fc1_cols, p.fc1_cols);
  // The forward takes a workspace of its own size, the backward one of the full size.
  EXPECT_LE(plan.forward_workspace_bytes, plan.workspace_bytes);
  std::vector<uint8_t> saved(plan.saved_bytes, 0xA5), workspace(plan.workspace_bytes, 0x5A),
      forward_workspace(plan.forward_workspace_bytes, 0x5A);
  const int64_t act = c.dtype == SFMOE_DTYPE_BF16 ? 2 : 4;
  run->y.assign(T * H * act, 0xEE);
  run->aux.assign(1, -1.0f);
  run->kept.assign(E, -1);
  run->dropped.assign(E, -1);
  Stored x = p.x, w1 = p.w1, w2 = p.w2, d_y = p.d_y;
  std::vector<float> logits = p.logits, bias = p.bias;
  sfmoe_tensor t_x = host_tensor(x.bytes.data(), c.dtype, {T, H});
  sfmoe_tensor t_logits = host_tensor(logits.data(), SFMOE_DTYPE_FP32, {T, E});
  sfmoe_tensor t_bias = host_tensor(bias.data(), SFMOE_DTYPE_FP32, {E});
  sfmoe_tensor t_w1 = host_tensor(w1.bytes.data(), c.dtype, {E, p.fc1_cols, H});
  sfmoe_tensor t_w2 = host_tensor(w2.bytes.data(), c.dtype, {E, H, c.ffn});
  sfmoe_tensor t_y = host_tensor(run->y.data(), c.dtype, {T, H});
  sfmoe_tensor t_saved = host_tensor(saved.data(), kBytes, {plan.saved_bytes});
  sfmoe_tensor t_ws = host_tensor(workspace.data(), kBytes, {plan.workspace_bytes});
  sfmoe_tensor t_forward_ws =
      host_tensor(forward_workspace.data(), kBytes, {plan.forward_workspace_bytes});
  sfmoe_tensor t_aux = host_tensor(run->aux.data(), SFMOE_DTYPE_FP32, {1});
  sfmoe_tensor t_kept = host_tensor(run->kept.data(), SFMOE_DTYPE_INT64, {E});
  sfmoe_tensor t_dropped = host_tensor(run->dropped.data(), SFMOE_DTYPE_INT64, {E});
  sfmoe_moe_forward_args f = sfmoe_moe_forward_args_init();
  f.x = &t_x;
  f.logits = &t_logits;
  f.expert_bias = bias.empty() ? nullptr : &t_bias;
  f.w1 = &t_w1;
  f.w2 = &t_w2;
  f.y = &t_y;
  f.saved = &t_saved;
  f.workspace = &t_forward_ws;
  f.aux_loss = c.aux_loss_coeff > 0 ? &t_aux : nullptr;
  f.tokens_per_expert = &t_kept;
  f.dropped_per_expert = &t_dropped;
  if (cache != nullptr && cache->cache->empty())
    cache->cache->assign(plan.weight_cache_bytes, 0x5A);
  sfmoe_tensor t_cache = host_tensor(cache ? cache->cache->data() : nullptr, kBytes,
                                     {cache ? static_cast<int64_t>(cache->cache->size()) : 0});
  if (cache != nullptr) {
    f.weight_cache = &t_cache;
    f.weight_cache_filled = cache->forward_filled;
  }
  bool ok = sfmoe_moe_layer_forward(layer, &f) == SFMOE_SUCCESS;
  EXPECT_TRUE(ok) << sfmoe_last_error();

  const sfmoe_dtype grads = c.accumulate ? SFMOE_DTYPE_FP32 : c.dtype;
  const int64_t gbytes = c.accumulate ? 4 : act;
  run->d_x.assign(T * H * act, 0xEE);
  run->d_logits.assign(T * E, -7.0f);
  run->d_w1.assign(E * p.fc1_cols * H * gbytes, 0xEE);
  run->d_w2.assign(E * H * c.ffn * gbytes, 0xEE);
  if (c.accumulate) {  // main gradients that already hold something
    const std::vector<float> a = LayerProblem::normal(rng, E * p.fc1_cols * H, 0.1);
    const std::vector<float> b = LayerProblem::normal(rng, E * H * c.ffn, 0.1);
    memcpy(run->d_w1.data(), a.data(), a.size() * 4);
    memcpy(run->d_w2.data(), b.data(), b.size() * 4);
    run->d_w1_start.assign(a.begin(), a.end());
    run->d_w2_start.assign(b.begin(), b.end());
  }
  sfmoe_tensor t_dy = host_tensor(d_y.bytes.data(), c.dtype, {T, H});
  sfmoe_tensor t_dx = host_tensor(run->d_x.data(), c.dtype, {T, H});
  sfmoe_tensor t_dlogits = host_tensor(run->d_logits.data(), SFMOE_DTYPE_FP32, {T, E});
  sfmoe_tensor t_dw1 = host_tensor(run->d_w1.data(), grads, {E, p.fc1_cols, H});
  sfmoe_tensor t_dw2 = host_tensor(run->d_w2.data(), grads, {E, H, c.ffn});
  sfmoe_moe_backward_args b = sfmoe_moe_backward_args_init();
  b.x = &t_x;
  b.d_y = &t_dy;
  b.logits = &t_logits;
  b.w1 = &t_w1;
  b.w2 = &t_w2;
  b.saved = &t_saved;
  b.workspace = &t_ws;
  b.d_x = &t_dx;
  b.d_logits = &t_dlogits;
  b.d_w1 = &t_dw1;
  b.d_w2 = &t_dw2;
  b.rng_offset = rng_offset;
  sfmoe_tensor t_offset = host_tensor(rng_offset_device, offset_dtype, {1});
  if (rng_offset_device != nullptr) b.rng_offset_device = &t_offset;
  if (cache != nullptr) {
    b.weight_cache = &t_cache;
    b.weight_cache_filled = cache->backward_filled;
  }
  bool backward_ok = true;
  if (backward_status != nullptr) {
    *backward_status = sfmoe_moe_layer_backward(layer, &b);
    sfmoe_moe_layer_destroy(layer);
    return ok;
  }
  if (backward == Backward::kWhole) {
    backward_ok = sfmoe_moe_layer_backward(layer, &b) == SFMOE_SUCCESS;
  } else if (backward == Backward::kThreeParts) {
    b.part = SFMOE_MOE_BACKWARD_FC2_DGRAD;
    b.d_w2 = nullptr;  // the FC2_DGRAD part writes no weight gradient
    backward_ok = sfmoe_moe_layer_backward(layer, &b) == SFMOE_SUCCESS;
    b.part = SFMOE_MOE_BACKWARD_FC1;
    b.d_y = nullptr;
    b.w2 = nullptr;
    backward_ok = backward_ok && sfmoe_moe_layer_backward(layer, &b) == SFMOE_SUCCESS;
    std::fill(saved.begin(), saved.end(), 0x7B);  // free once FC1 has run
    b.part = SFMOE_MOE_BACKWARD_FC2_WGRAD;
    b.d_y = &t_dy;
    b.saved = nullptr;
    b.x = b.logits = b.w1 = nullptr;
    b.d_x = b.d_logits = b.d_w1 = nullptr;
    b.d_w2 = &t_dw2;
    backward_ok = backward_ok && sfmoe_moe_layer_backward(layer, &b) == SFMOE_SUCCESS;
  } else {
    b.part = SFMOE_MOE_BACKWARD_FC2;
    backward_ok = sfmoe_moe_layer_backward(layer, &b) == SFMOE_SUCCESS;
    std::vector<uint8_t> fc1_workspace(plan.fc1_backward_workspace_bytes, 0x3C);
    sfmoe_tensor t_fc1_ws =
        host_tensor(fc1_workspace.data(), kBytes, {plan.fc1_backward_workspace_bytes});
    b.part = SFMOE_MOE_BACKWARD_FC1;
    b.workspace = &t_fc1_ws;
    b.d_y = nullptr;  // the FC1 part reads neither
    b.w2 = nullptr;
    backward_ok = backward_ok && sfmoe_moe_layer_backward(layer, &b) == SFMOE_SUCCESS;
  }
  EXPECT_TRUE(backward_ok) << sfmoe_last_error();
  sfmoe_moe_layer_destroy(layer);
  return ok && backward_ok;
}

std::vector<double> plus(std::vector<double> a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) a[i] += b[i];
  return a;
}

TEST(MoeLayer, ForwardAndBackwardMatchTheDenseReferenceOnTheHost) {
  std::mt19937_64 rng(session_test_seed() + 101);
  std::vector<LayerCase> cases;
  cases.push_back({"fp32 softmax swiglu", 37, 50, 24, 16, 6, 2, 0, 8, SFMOE_DTYPE_FP32});
  {
    LayerCase c{"fp32 sigmoid squared-relu, odd H, capacity drops, skewed bias, aux loss",
                41,
                41,
                13,
                7,
                5,
                3,
                9,
                1,
                SFMOE_DTYPE_FP32,
                SFMOE_ACTIVATION_SQUARED_RELU,
                true,
                true,
                0.01f};
    cases.push_back(c);
  }
  {
    LayerCase c{"bf16 softmax swiglu, main grads", 64, 80, 40, 24, 8, 2, 0, 16, SFMOE_DTYPE_BF16};
    c.accumulate = true;
    cases.push_back(c);
  }
  cases.push_back({"bf16 silu, alignment 128, empty experts", 29, 29, 16, 8, 7, 1, 0, 128,
                   SFMOE_DTYPE_BF16, SFMOE_ACTIVATION_SILU, false, true});
  cases.push_back({"no tokens", 0, 16, 16, 8, 4, 2, 0, 16, SFMOE_DTYPE_BF16});
  for (const LayerCase& c : cases) {
    SCOPED_TRACE(c.name);
    const LayerProblem p(c, rng);
    const LayerReference r = reference_layer(p);
    HostLayerRun run;
    ASSERT_TRUE(run_on_host(p, rng, &run));
    const double tol = c.dtype == SFMOE_DTYPE_FP32 ? 1e-9 : 2e-4;
    const int64_t T = c.tokens, H = c.hidden;
    const sfmoe_dtype grads = c.accumulate ? SFMOE_DTYPE_FP32 : c.dtype;
    EXPECT_LT(mismatch(r.y, values_of(c.dtype, run.y.data(), T * H)), tol) << "y";
    EXPECT_LT(mismatch(r.d_x, values_of(c.dtype, run.d_x.data(), T * H)), tol) << "d_x";
    std::vector<double> want_w1 = r.d_w1, want_w2 = r.d_w2;
    if (c.accumulate) {
      want_w1 = plus(want_w1, run.d_w1_start);
      want_w2 = plus(want_w2, run.d_w2_start);
    }
    EXPECT_LT(mismatch(want_w1, values_of(grads, run.d_w1.data(), want_w1.size())), tol) << "d_w1";
    EXPECT_LT(mismatch(want_w2, values_of(grads, run.d_w2.data(), want_w2.size())), tol) << "d_w2";
    std::vector<double> d_logits(run.d_logits.begin(), run.d_logits.end());
    EXPECT_LT(mismatch(r.d_logits, d_logits), c.dtype == SFMOE_DTYPE_FP32 ? 1e-8 : 1e-3)
        << "d_logits";
    EXPECT_EQ(run.kept, r.kept) << "tokens_per_expert";
    EXPECT_EQ(run.dropped, r.dropped) << "dropped_per_expert";
    if (c.aux_loss_coeff > 0) {
      EXPECT_EQ(run.aux[0], r.aux_loss) << "aux loss";
    }
    // The backward in its two and three parts: the same bits (the same rng for the same problem).
    std::mt19937_64 again = rng, third = rng;
    HostLayerRun whole, parts, three;
    ASSERT_TRUE(run_on_host(p, rng, &whole));
    ASSERT_TRUE(run_on_host(p, again, &parts, Backward::kTwoParts));
    ASSERT_TRUE(run_on_host(p, third, &three, Backward::kThreeParts));
    for (const HostLayerRun* split : {&parts, &three}) {
      EXPECT_EQ(whole.d_x, split->d_x);
      EXPECT_EQ(whole.d_w1, split->d_w1);
      EXPECT_EQ(whole.d_w2, split->d_w2);
      EXPECT_EQ(whole.d_logits, split->d_logits);
    }
  }
  std::printf("[ moe layer ] %zu host cases: y, d_x, d_w1, d_w2, d_logits vs the dense reference\n",
              cases.size());
}

// FC1's rows gathered from the tokens (the BF16 recipe's default on the host) and the same layer
// with permute copying them out (SFMOE_LAYER_GATHER_ROWS=0, read when a layer is planned): the
// same bits in every output and gradient; padding rows, capacity drops and empty experts in the
// mix.
TEST(MoeLayer, GatheredFc1RowsGiveTheBitsOfTheCopiedRows) {
  std::mt19937_64 rng(session_test_seed() + 102);
  std::vector<LayerCase> cases;
  cases.push_back(
      {"fp32 softmax swiglu, alignment 8", 37, 50, 24, 16, 6, 2, 0, 8, SFMOE_DTYPE_FP32});
  cases.push_back({"bf16 silu, alignment 128, capacity drops, empty experts", 29, 29, 16, 8, 7, 2,
                   5, 128, SFMOE_DTYPE_BF16, SFMOE_ACTIVATION_SILU, false, true});
  for (const LayerCase& c : cases) {
    SCOPED_TRACE(c.name);
    const LayerProblem p(c, rng);
    std::mt19937_64 again = rng;
    HostLayerRun gathered, copied;
    ASSERT_EQ(unsetenv("SFMOE_LAYER_GATHER_ROWS"), 0);
    ASSERT_TRUE(run_on_host(p, rng, &gathered));
    ASSERT_EQ(setenv("SFMOE_LAYER_GATHER_ROWS", "0", 1), 0);
    const bool ran = run_on_host(p, again, &copied);
    ASSERT_EQ(unsetenv("SFMOE_LAYER_GATHER_ROWS"), 0);
    ASSERT_TRUE(ran);
    EXPECT_EQ(gathered.y, copied.y);
    EXPECT_EQ(gathered.d_x, copied.d_x);
    EXPECT_EQ(gathered.d_w1, copied.d_w1);
    EXPECT_EQ(gathered.d_w2, copied.d_w2);
    EXPECT_EQ(gathered.d_logits, copied.d_logits);
    EXPECT_EQ(gathered.kept, copied.kept);
    EXPECT_EQ(gathered.dropped, copied.dropped);
  }
}

// The quantized recipes on the host (the CPU grouped GEMM over the operands' decoded codes):
// every output and gradient within the recipe's tolerance of the dense reference, the counts
// exact; odd token counts, empty experts and a capacity in the mix.
// The plan's backward peaks follow docs/moe_layer.md's sums of its buffers and the new gradients,
// and the three-part order is the plan's choice where FC1's saved rows are wide against the
// hidden rows (Mixtral-8x7B's shape), not at Qwen3-30B-A3B's or DeepSeek-V3 EP8-local's, nor with
// main gradients (no new weight gradients to make room for). Host plans: nothing is allocated.
TEST(MoeLayer, PlanChoosesTheBackwardOrderWithTheLowerPeak) {
  struct Case {
    LayerCase c;
    bool three;
  };
  LayerCase mixtral{"mixtral", 8192, 8192, 4096, 14336, 8, 2, 0, 1, SFMOE_DTYPE_BF16};
  LayerCase main_grads = mixtral;
  main_grads.accumulate = true;
  const Case cases[] = {
      {mixtral, true},
      {{"qwen3", 8192, 8192, 2048, 768, 128, 8, 0, 1, SFMOE_DTYPE_BF16}, false},
      {{"deepseek-v3 ep8-local", 4096, 4096, 7168, 2048, 32, 8, 0, 1, SFMOE_DTYPE_BF16}, false},
      {main_grads, false}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.c.name);
    sfmoe_moe_layer_config config = layer_config(k.c);
    sfmoe_moe_layer* layer = nullptr;
    ASSERT_EQ(sfmoe_moe_layer_create(&config, SFMOE_MEMORY_HOST, 0, &layer), SFMOE_SUCCESS)
        << sfmoe_last_error();
    sfmoe_moe_layer_plan p = sfmoe_moe_layer_plan_init();
    ASSERT_EQ(sfmoe_moe_layer_get_plan(layer, &p), SFMOE_SUCCESS);
    sfmoe_moe_layer_destroy(layer);
    const int64_t T = k.c.tokens, H = k.c.hidden, F = k.c.ffn, E = k.c.experts;
    const int64_t grad = k.c.accumulate ? 0 : 2;
    const int64_t g1 = E * p.fc1_cols * H * grad, g2 = E * H * F * grad, d = T * H * 2 + T * E * 4;
    const int64_t S = p.saved_bytes, W = p.workspace_bytes, W1 = p.fc1_backward_workspace_bytes;
    EXPECT_EQ(p.backward_peak_bytes_two_parts, std::max(S + W + g2, S + g2 + W1 + g1 + d));
    EXPECT_EQ(p.backward_peak_bytes_three_parts, std::max(S + W + g1 + d, W + g1 + g2 + d));
    EXPECT_EQ(p.three_part_backward, k.three ? 1 : 0);
  }
}

TEST(MoeLayer, QuantizedRecipesStayWithinTheirTolerancesOfTheReference) {
  std::mt19937_64 rng(session_test_seed() + 102);
  const sfmoe_moe_recipe recipes[] = {SFMOE_MOE_RECIPE_FP8_TENSOR, SFMOE_MOE_RECIPE_FP8_BLOCKWISE,
                                      SFMOE_MOE_RECIPE_MXFP8, SFMOE_MOE_RECIPE_NVFP4};
  for (sfmoe_moe_recipe recipe : recipes) {
    for (int shape = 0; shape < 3; ++shape) {
      LayerCase c = shape == 0 ? LayerCase{"swiglu", 77, 90, 256, 128, 6, 2, 0, 128}
                               : LayerCase{"squared relu, capacity, skewed bias",
                                           50,
                                           50,
                                           128,
                                           256,
                                           5,
                                           3,
                                           20,
                                           128,
                                           SFMOE_DTYPE_BF16,
                                           SFMOE_ACTIVATION_SQUARED_RELU,
                                           true,
                                           true};
      if (shape == 2) {  // the tensors' magnitudes 2^6 to 2^-10 apart
        c.name = "squared relu, capacity, magnitudes apart";
        c.x_scale = 64.0;
        c.w2_scale = 1.0 / 1024;
        c.d_y_scale = 1.0 / 16;
      }
      c.recipe = recipe;
      c.accumulate = shape == 1;
      SCOPED_TRACE(c.name + " recipe " + std::to_string(static_cast<int>(recipe)));
      const LayerProblem p(c, rng);
      const LayerReference r = reference_layer(p);
      HostLayerRun run;
      ASSERT_TRUE(run_on_host(p, rng, &run));
      const double tol = recipe_tolerance(recipe);
      const int64_t T = c.tokens, H = c.hidden;
      const sfmoe_dtype grads = c.accumulate ? SFMOE_DTYPE_FP32 : c.dtype;
      std::vector<double> want_w1 = r.d_w1, want_w2 = r.d_w2;
      if (c.accumulate) {
        want_w1 = plus(want_w1, run.d_w1_start);
        want_w2 = plus(want_w2, run.d_w2_start);
      }
      const double e[] = {mismatch(r.y, values_of(c.dtype, run.y.data(), T * H)),
                          mismatch(r.d_x, values_of(c.dtype, run.d_x.data(), T * H)),
                          mismatch(want_w1, values_of(grads, run.d_w1.data(), want_w1.size())),
                          mismatch(want_w2, values_of(grads, run.d_w2.data(), want_w2.size()))};
      EXPECT_LT(e[0], tol) << "y";
      EXPECT_LT(e[1], tol) << "d_x";
      EXPECT_LT(e[2], tol) << "d_w1";
      EXPECT_LT(e[3], tol) << "d_w2";
      std::vector<double> d_logits(run.d_logits.begin(), run.d_logits.end());
      EXPECT_LT(mismatch(r.d_logits, d_logits), 10 * tol) << "d_logits";
      EXPECT_EQ(run.kept, r.kept);
      EXPECT_EQ(run.dropped, r.dropped);
      // (a quantized recipe that silently ran in BF16 would sit below the BF16 bound)
      EXPECT_GT(e[0] + e[1] + e[2] + e[3], 2e-5) << "no quantization error at all";
      // The three-part backward: the same bits (NVFP4's rounding streams are the GEMMs', not the
      // parts').
      std::mt19937_64 again = rng;
      HostLayerRun whole, three;
      ASSERT_TRUE(run_on_host(p, rng, &whole, Backward::kWhole, 5));
      ASSERT_TRUE(run_on_host(p, again, &three, Backward::kThreeParts, 5));
      EXPECT_EQ(whole.d_x, three.d_x);
      EXPECT_EQ(whole.d_w1, three.d_w1);
      EXPECT_EQ(whole.d_w2, three.d_w2);
      EXPECT_EQ(whole.d_logits, three.d_logits);
      std::printf("[ moe layer ] recipe %d %-36s mismatch y %.1e d_x %.1e d_w1 %.1e d_w2 %.1e\n",
                  static_cast<int>(recipe), c.name.c_str(), e[0], e[1], e[2], e[3]);
    }
  }
}

// The weight cache (gradient accumulation): a step that fills it and a step that reads it give
// the bits of a step without it, in every quantized recipe and backward order; a step that reads
// it uses the copies there, not the weights it is handed (so nothing was quantized again); and
// bad cache arguments are refused with nothing written.
TEST(MoeLayer, WeightCacheGivesTheBitsOfQuantizingEveryStep) {
  std::mt19937_64 rng(session_test_seed() + 104);
  const sfmoe_moe_recipe recipes[] = {SFMOE_MOE_RECIPE_FP8_TENSOR, SFMOE_MOE_RECIPE_FP8_BLOCKWISE,
                                      SFMOE_MOE_RECIPE_MXFP8, SFMOE_MOE_RECIPE_NVFP4};
  for (sfmoe_moe_recipe recipe : recipes) {
    for (const Backward order : {Backward::kWhole, Backward::kThreeParts}) {
      LayerCase c{"swiglu", 77, 90, 256, 128, 6, 2, 0, 128};
      c.recipe = recipe;
      SCOPED_TRACE("recipe " + std::to_string(static_cast<int>(recipe)) +
                   (order == Backward::kWhole ? ", whole backward" : ", three parts"));
      const LayerProblem p(c, rng);
      auto same = [](const HostLayerRun& a, const HostLayerRun& b) {
        return a.y == b.y && a.d_x == b.d_x && a.d_w1 == b.d_w1 && a.d_w2 == b.d_w2 &&
               a.d_logits == b.d_logits;
      };
      std::mt19937_64 r0 = rng, r1 = rng, r2 = rng, r3 = rng;
      HostLayerRun plain, filling, reading, stale;
      ASSERT_TRUE(run_on_host(p, r0, &plain, order, 5));
      std::vector<uint8_t> cache;
      const WeightCacheUse fill{&cache, false, false}, read{&cache, true, true};
      ASSERT_TRUE(
          run_on_host(p, r1, &filling, order, 5, nullptr, SFMOE_DTYPE_INT64, nullptr, &fill));
      EXPECT_GT(cache.size(), 0u);
      EXPECT_TRUE(same(plain, filling)) << "the step that fills the cache";
      ASSERT_TRUE(
          run_on_host(p, r2, &reading, order, 5, nullptr, SFMOE_DTYPE_INT64, nullptr, &read));
      EXPECT_TRUE(same(plain, reading)) << "the step that reads the cache";
      {  // the cache filled by sfmoe_moe_layer_fill_weight_cache: the same bytes
        sfmoe_moe_layer_config config = layer_config(c);
        sfmoe_moe_layer* layer = nullptr;
        ASSERT_EQ(sfmoe_moe_layer_create(&config, SFMOE_MEMORY_HOST, 0, &layer), SFMOE_SUCCESS);
        Stored w1 = p.w1, w2 = p.w2;
        sfmoe_tensor t_w1 =
            host_tensor(w1.bytes.data(), c.dtype, {c.experts, p.fc1_cols, c.hidden});
        sfmoe_tensor t_w2 = host_tensor(w2.bytes.data(), c.dtype, {c.experts, c.hidden, c.ffn});
        std::vector<uint8_t> filled(cache.size(), 0x5A);
        sfmoe_tensor t_cache =
            host_tensor(filled.data(), kBytes, {static_cast<int64_t>(filled.size())});
        EXPECT_EQ(
            sfmoe_moe_layer_fill_weight_cache(layer, &t_w1, &t_w2, &t_cache, nullptr, nullptr),
            SFMOE_SUCCESS)
            << sfmoe_last_error();
        sfmoe_moe_layer_destroy(layer);
        EXPECT_EQ(filled, cache) << "sfmoe_moe_layer_fill_weight_cache";
      }
      // Other weights with the cache read: the results are still those of the cached weights.
      LayerProblem other = p;
      const LayerProblem fresh(c, rng);
      other.w1 = fresh.w1;
      other.w2 = fresh.w2;
      ASSERT_TRUE(
          run_on_host(other, r3, &stale, order, 5, nullptr, SFMOE_DTYPE_INT64, nullptr, &read));
      EXPECT_EQ(stale.y, plain.y) << "the forward quantized the weights it was handed";
      EXPECT_EQ(stale.d_x, plain.d_x) << "the backward quantized the weights it was handed";
    }
  }
  // The plan holds no cache under BF16; bad cache arguments are refused before anything runs.
  LayerCase c{"swiglu", 9, 16, 128, 128, 4, 2, 0, 128};
  sfmoe_moe_layer_config config = layer_config(c);
  sfmoe_moe_layer* layer = nullptr;
  ASSERT_EQ(sfmoe_moe_layer_create(&config, SFMOE_MEMORY_HOST, 0, &layer), SFMOE_SUCCESS);
  sfmoe_moe_layer_plan plan = sfmoe_moe_layer_plan_init();
  ASSERT_EQ(sfmoe_moe_layer_get_plan(layer, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.weight_cache_bytes, 0);
  sfmoe_moe_layer_destroy(layer);
  c.recipe = SFMOE_MOE_RECIPE_FP8_BLOCKWISE;
  const LayerProblem p(c, rng);
  config = layer_config(c);
  ASSERT_EQ(sfmoe_moe_layer_create(&config, SFMOE_MEMORY_HOST, 0, &layer), SFMOE_SUCCESS);
  ASSERT_EQ(sfmoe_moe_layer_get_plan(layer, &plan), SFMOE_SUCCESS);
  ASSERT_GT(plan.weight_cache_bytes, 0);
  const int64_t T = c.tokens, H = c.hidden, E = c.experts;
  Stored x = p.x, w1 = p.w1, w2 = p.w2;
  std::vector<float> logits = p.logits;
  std::vector<uint8_t> y(T * H * 2, 0xEE), saved(plan.saved_bytes), ws(plan.workspace_bytes);
  std::vector<uint8_t> cache(plan.weight_cache_bytes, 0x5A);
  sfmoe_tensor t_x = host_tensor(x.bytes.data(), c.dtype, {T, H});
  sfmoe_tensor t_logits = host_tensor(logits.data(), SFMOE_DTYPE_FP32, {T, E});
  sfmoe_tensor t_w1 = host_tensor(w1.bytes.data(), c.dtype, {E, p.fc1_cols, H});
  sfmoe_tensor t_w2 = host_tensor(w2.bytes.data(), c.dtype, {E, H, c.ffn});
  sfmoe_tensor t_y = host_tensor(y.data(), c.dtype, {T, H});
  sfmoe_tensor t_saved = host_tensor(saved.data(), kBytes, {plan.saved_bytes});
  sfmoe_tensor t_ws = host_tensor(ws.data(), kBytes, {plan.workspace_bytes});
  sfmoe_moe_forward_args f = sfmoe_moe_forward_args_init();
  f.x = &t_x;
  f.logits = &t_logits;
  f.w1 = &t_w1;
  f.w2 = &t_w2;
  f.y = &t_y;
  f.saved = &t_saved;
  f.workspace = &t_ws;
  struct Bad {
    const char* what;
    bool given;        // a cache is passed
    int64_t short_by;  // bytes it lacks
    int32_t filled;
    sfmoe_status status;
  };
  for (const Bad& bad : {Bad{"filled without a cache", false, 0, 1, SFMOE_ERROR_NULL_POINTER},
                         Bad{"a cache a byte short", true, 1, 0, SFMOE_ERROR_SHAPE_MISMATCH},
                         Bad{"filled 2", true, 0, 2, SFMOE_ERROR_INVALID_ARGUMENT}}) {
    SCOPED_TRACE(bad.what);
    sfmoe_tensor t_cache =
        host_tensor(cache.data(), kBytes, {plan.weight_cache_bytes - bad.short_by});
    f.weight_cache = bad.given ? &t_cache : nullptr;
    f.weight_cache_filled = bad.filled;
    EXPECT_EQ(sfmoe_moe_layer_forward(layer, &f), bad.status) << sfmoe_last_error();
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](uint8_t v) { return v == 0xEE; }));
    EXPECT_TRUE(std::all_of(cache.begin(), cache.end(), [](uint8_t v) { return v == 0x5A; }));
  }
  sfmoe_moe_layer_destroy(layer);
}

// NVFP4's rounding offset read when the backward runs (rng_offset_device) adds to the host's:
// offsets 7 + 5 give the bits of 12, and a new device value other gradients.
TEST(MoeLayer, Nvfp4RoundingOffsetOnTheDeviceAddsToTheHostOffset) {
  std::mt19937_64 rng(session_test_seed() + 104);
  LayerCase c{"swiglu", 77, 90, 256, 128, 6, 2, 0, 128};
  c.recipe = SFMOE_MOE_RECIPE_NVFP4;
  const LayerProblem p(c, rng);
  std::mt19937_64 r1 = rng, r2 = rng, r3 = rng;
  HostLayerRun sum, split, next;
  alignas(16) int64_t on_device = 5;  // (tensors are 16-byte aligned)
  ASSERT_TRUE(run_on_host(p, r1, &sum, Backward::kWhole, 12));
  ASSERT_TRUE(run_on_host(p, r2, &split, Backward::kWhole, 7, &on_device));
  on_device = 6;
  ASSERT_TRUE(run_on_host(p, r3, &next, Backward::kWhole, 7, &on_device));
  EXPECT_EQ(split.y, sum.y);
  EXPECT_EQ(split.d_x, sum.d_x);
  EXPECT_EQ(split.d_w1, sum.d_w1);
  EXPECT_EQ(split.d_w2, sum.d_w2);
  EXPECT_EQ(split.d_logits, sum.d_logits);
  EXPECT_TRUE(next.d_x != sum.d_x || next.d_w1 != sum.d_w1 || next.d_w2 != sum.d_w2)
      << "the device offset is read";
  // A device offset of another dtype, or misaligned, is refused, naming it, with no gradient
  // written (they keep the bytes run_on_host fills them with).
  alignas(16) int64_t storage[3] = {5, 5, 5};
  const std::pair<void*, sfmoe_dtype> bad[] = {
      {storage, SFMOE_DTYPE_FP32}, {reinterpret_cast<char*>(storage) + 8, SFMOE_DTYPE_INT64}};
  for (const auto& [pointer, dtype] : bad) {
    std::mt19937_64 r = rng;
    HostLayerRun refused;
    sfmoe_status status = SFMOE_SUCCESS;
    ASSERT_TRUE(run_on_host(p, r, &refused, Backward::kWhole, 7, pointer, dtype, &status));
    EXPECT_NE(status, SFMOE_SUCCESS);
    EXPECT_NE(std::string(sfmoe_last_error()).find("rng_offset_device"), std::string::npos)
        << sfmoe_last_error();
    for (uint8_t v : refused.d_x) ASSERT_EQ(v, 0xEE) << "a refused backward wrote d_x";
    for (uint8_t v : refused.d_w1) ASSERT_EQ(v, 0xEE) << "a refused backward wrote d_w1";
  }
}

TEST(MoeLayer, RefusesBadConfigurationsAndCallsWithoutWriting) {
  sfmoe_moe_layer_config config = sfmoe_moe_layer_config_init();
  config.hidden = 16;
  config.ffn_hidden = 8;
  config.num_experts = 4;
  config.max_tokens = 8;
  config.router.top_k = 2;
  sfmoe_moe_layer* layer = nullptr;
  sfmoe_moe_layer_config bad = config;
  bad.row_alignment = 3;
  EXPECT_EQ(sfmoe_moe_layer_create(&bad, SFMOE_MEMORY_HOST, 0, &layer),
            SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sfmoe_last_error()).find("row_alignment"), std::string::npos);
  bad = config;
  bad.router.top_k = 5;
  EXPECT_EQ(sfmoe_moe_layer_create(&bad, SFMOE_MEMORY_HOST, 0, &layer),
            SFMOE_ERROR_INVALID_ARGUMENT);
  bad = config;
  bad.recipe = static_cast<sfmoe_moe_recipe>(7);
  EXPECT_EQ(sfmoe_moe_layer_create(&bad, SFMOE_MEMORY_HOST, 0, &layer),
            SFMOE_ERROR_INVALID_ARGUMENT);
  bad = config;
  bad.recipe = SFMOE_MOE_RECIPE_FP8_BLOCKWISE;  // H 16: not a whole 128-column block
  bad.row_alignment = 128;
  EXPECT_EQ(sfmoe_moe_layer_create(&bad, SFMOE_MEMORY_HOST, 0, &layer), SFMOE_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sfmoe_last_error()).find("multiples of 128"), std::string::npos);
  bad.hidden = 256;
  bad.ffn_hidden = 128;
  bad.row_alignment = 16;  // the blocks down the rows need 128
  EXPECT_EQ(sfmoe_moe_layer_create(&bad, SFMOE_MEMORY_HOST, 0, &layer),
            SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sfmoe_last_error()).find("row_alignment"), std::string::npos);
  // Sizes whose products overflow (found by tests/fuzz: the planner multiplied them unchecked)
  for (int which = 0; which < 3; ++which) {
    bad = config;
    (which == 0   ? bad.ffn_hidden
     : which == 1 ? bad.hidden
                  : bad.max_tokens) = int64_t{3810460716311722535};
    EXPECT_EQ(sfmoe_moe_layer_create(&bad, SFMOE_MEMORY_HOST, 0, &layer),
              SFMOE_ERROR_SHAPE_MISMATCH)
        << which;
    EXPECT_NE(std::string(sfmoe_last_error()).find("sizes overflow"), std::string::npos);
  }
  EXPECT_EQ(layer, nullptr);

  ASSERT_EQ(sfmoe_moe_layer_create(&config, SFMOE_MEMORY_HOST, 0, &layer), SFMOE_SUCCESS);
  sfmoe_moe_layer_plan plan = sfmoe_moe_layer_plan_init();
  ASSERT_EQ(sfmoe_moe_layer_get_plan(layer, &plan), SFMOE_SUCCESS);
  std::vector<uint16_t> x(9 * 16, 0), w1(4 * 16 * 16, 0), w2(4 * 16 * 8, 0), y(9 * 16, 0x7777);
  std::vector<float> logits(9 * 4, 0.0f);
  std::vector<uint8_t> saved(plan.saved_bytes), workspace(plan.workspace_bytes);
  sfmoe_tensor t_x = host_tensor(x.data(), SFMOE_DTYPE_BF16, {9, 16});  // 9 > max_tokens
  sfmoe_tensor t_logits = host_tensor(logits.data(), SFMOE_DTYPE_FP32, {9, 4});
  sfmoe_tensor t_w1 = host_tensor(w1.data(), SFMOE_DTYPE_BF16, {4, 16, 16});
  sfmoe_tensor t_w2 = host_tensor(w2.data(), SFMOE_DTYPE_BF16, {4, 16, 8});
  sfmoe_tensor t_y = host_tensor(y.data(), SFMOE_DTYPE_BF16, {9, 16});
  sfmoe_tensor t_saved = host_tensor(saved.data(), kBytes, {plan.saved_bytes});
  sfmoe_tensor t_ws = host_tensor(workspace.data(), kBytes, {plan.forward_workspace_bytes - 1});
  sfmoe_moe_forward_args f = sfmoe_moe_forward_args_init();
  f.x = &t_x;
  f.logits = &t_logits;
  f.w1 = &t_w1;
  f.w2 = &t_w2;
  f.y = &t_y;
  f.saved = &t_saved;
  f.workspace = &t_ws;
  EXPECT_EQ(sfmoe_moe_layer_forward(layer, &f), SFMOE_ERROR_SHAPE_MISMATCH);
  EXPECT_NE(std::string(sfmoe_last_error()).find("max_tokens"), std::string::npos)
      << sfmoe_last_error();
  t_x.shape[0] = t_logits.shape[0] = t_y.shape[0] = 8;
  EXPECT_EQ(sfmoe_moe_layer_forward(layer, &f), SFMOE_ERROR_SHAPE_MISMATCH);
  EXPECT_NE(std::string(sfmoe_last_error()).find("workspace"), std::string::npos)
      << sfmoe_last_error();
  for (uint16_t v : y) ASSERT_EQ(v, 0x7777) << "a refused call wrote y";
  sfmoe_moe_layer_destroy(layer);
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

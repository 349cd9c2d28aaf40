// The MoE layer on the GPU: forward and backward against the dense reference (the host suite's,
// tests/cpp/moe_layer_reference.h), and one CUDA graph of forward + backward replayed on new
// tokens and routings, each replay equal bit for bit to an eager run on the same inputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "sfmoe/moe_layer.h"
#include "tests/cpp/moe_layer_reference.h"
#include "tests/cpp/numerics_cases.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

constexpr sfmoe_dtype kBytes = SFMOE_DTYPE_FP8_E4M3;  // a one-byte dtype for plain buffers

// The device buffers of one layer step: inputs, outputs, saved state and workspace.
struct DeviceLayer {
  LayerCase c;
  sfmoe_moe_layer* layer = nullptr;
  sfmoe_moe_layer_plan plan = sfmoe_moe_layer_plan_init();
  int64_t fc1;
  DeviceBuffer<uint8_t> x, w1, w2, d_y, saved, workspace;
  DeviceBuffer<float> logits, bias, aux;
  struct Outputs {
    DeviceBuffer<uint8_t> y, d_x, d_w1, d_w2;
    DeviceBuffer<float> d_logits;
    DeviceBuffer<int64_t> kept;
    Outputs(const LayerCase& c, int64_t fc1, int64_t act, int64_t grad)
        : y(c.tokens * c.hidden * act),
          d_x(c.tokens * c.hidden * act),
          d_w1(c.experts * fc1 * c.hidden * grad),
          d_w2(c.experts * c.hidden * c.ffn * grad),
          d_logits(c.tokens * c.experts),
          kept(c.experts) {}
  };
  Outputs eager, graphed;

  static int64_t act_bytes(const LayerCase& c) { return c.dtype == SFMOE_DTYPE_BF16 ? 2 : 4; }
  static int64_t grad_bytes(const LayerCase& c) { return c.accumulate ? 4 : act_bytes(c); }

  DeviceLayer(const LayerCase& lc, int64_t fc1_cols, sfmoe_moe_layer_plan p)
      : c(lc),
        plan(p),
        fc1(fc1_cols),
        x(lc.tokens * lc.hidden * act_bytes(lc)),
        w1(lc.experts * fc1_cols * lc.hidden * act_bytes(lc)),
        w2(lc.experts * lc.hidden * lc.ffn * act_bytes(lc)),
        d_y(lc.tokens * lc.hidden * act_bytes(lc)),
        saved(p.saved_bytes),
        workspace(p.workspace_bytes),
        logits(lc.tokens * lc.experts),
        bias(lc.experts),
        aux(1),
        eager(lc, fc1_cols, act_bytes(lc), grad_bytes(lc)),
        graphed(lc, fc1_cols, act_bytes(lc), grad_bytes(lc)) {}

  void upload(const LayerProblem& p) {
    EXPECT_EQ(x.upload(p.x.bytes), cudaSuccess);
    EXPECT_EQ(w1.upload(p.w1.bytes), cudaSuccess);
    EXPECT_EQ(w2.upload(p.w2.bytes), cudaSuccess);
    EXPECT_EQ(d_y.upload(p.d_y.bytes), cudaSuccess);
    EXPECT_EQ(logits.upload(p.logits), cudaSuccess);
    if (!p.bias.empty()) EXPECT_EQ(bias.upload(p.bias), cudaSuccess);
  }

  // Forward then backward into `out`, enqueued on `stream`.
  sfmoe_status step(Outputs& out, cudaStream_t stream) {
    const int64_t T = c.tokens, H = c.hidden, E = c.experts;
    const sfmoe_memory m = SFMOE_MEMORY_CUDA;
    const sfmoe_dtype grads = c.accumulate ? SFMOE_DTYPE_FP32 : c.dtype;
    sfmoe_tensor t_x = tensor_in(m, x.ptr, c.dtype, {T, H});
    sfmoe_tensor t_logits = tensor_in(m, logits.ptr, SFMOE_DTYPE_FP32, {T, E});
    sfmoe_tensor t_bias = tensor_in(m, bias.ptr, SFMOE_DTYPE_FP32, {E});
    sfmoe_tensor t_w1 = tensor_in(m, w1.ptr, c.dtype, {E, fc1, H});
    sfmoe_tensor t_w2 = tensor_in(m, w2.ptr, c.dtype, {E, H, c.ffn});
    sfmoe_tensor t_y = tensor_in(m, out.y.ptr, c.dtype, {T, H});
    sfmoe_tensor t_saved = tensor_in(m, saved.ptr, kBytes, {plan.saved_bytes});
    sfmoe_tensor t_ws = tensor_in(m, workspace.ptr, kBytes, {plan.workspace_bytes});
    sfmoe_tensor t_aux = tensor_in(m, aux.ptr, SFMOE_DTYPE_FP32, {1});
    sfmoe_tensor t_kept = tensor_in(m, out.kept.ptr, SFMOE_DTYPE_INT64, {E});
    sfmoe_moe_forward_args f = sfmoe_moe_forward_args_init();
    f.x = &t_x;
    f.logits = &t_logits;
    f.expert_bias = c.skewed_bias ? &t_bias : nullptr;
    f.w1 = &t_w1;
    f.w2 = &t_w2;
    f.y = &t_y;
    f.saved = &t_saved;
    f.workspace = &t_ws;
    f.aux_loss = c.aux_loss_coeff > 0 ? &t_aux : nullptr;
    f.tokens_per_expert = &t_kept;
    f.stream = stream;
    const sfmoe_status forward = sfmoe_moe_layer_forward(layer, &f);
    if (forward != SFMOE_SUCCESS) return forward;
    sfmoe_tensor t_dy = tensor_in(m, d_y.ptr, c.dtype, {T, H});
    sfmoe_tensor t_dx = tensor_in(m, out.d_x.ptr, c.dtype, {T, H});
    sfmoe_tensor t_dlogits = tensor_in(m, out.d_logits.ptr, SFMOE_DTYPE_FP32, {T, E});
    sfmoe_tensor t_dw1 = tensor_in(m, out.d_w1.ptr, grads, {E, fc1, H});
    sfmoe_tensor t_dw2 = tensor_in(m, out.d_w2.ptr, grads, {E, H, c.ffn});
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
    b.stream = stream;
    return sfmoe_moe_layer_backward(layer, &b);
  }
};

// The device layer of case `c` and its plan (the caller destroys the layer).
void create_device_layer(const LayerCase& c, sfmoe_moe_layer** layer, sfmoe_moe_layer_plan* plan) {
  sfmoe_moe_layer_config config = layer_config(c);
  ASSERT_EQ(sfmoe_moe_layer_create(&config, SFMOE_MEMORY_CUDA, 0, layer), SFMOE_SUCCESS)
      << sfmoe_last_error();
  *plan = sfmoe_moe_layer_plan_init();
  ASSERT_EQ(sfmoe_moe_layer_get_plan(*layer, plan), SFMOE_SUCCESS);
}

std::vector<LayerCase> device_cases() {
  std::vector<LayerCase> cases;
  cases.push_back({"bf16 softmax swiglu", 300, 512, 64, 48, 8, 2, 0, 16});
  LayerCase skewed{"bf16 sigmoid swiglu, capacity drops, skewed bias, aux loss, alignment 128",
                   257,
                   257,
                   128,
                   64,
                   32,
                   4,
                   40,
                   128,
                   SFMOE_DTYPE_BF16,
                   SFMOE_ACTIVATION_SWIGLU,
                   true,
                   true,
                   0.01f};
  cases.push_back(skewed);
  LayerCase main_grads{
      "bf16 squared relu, FP32 main grads", 96, 128, 72, 40, 6, 2, 0, 8, SFMOE_DTYPE_BF16,
      SFMOE_ACTIVATION_SQUARED_RELU};
  main_grads.accumulate = true;
  cases.push_back(main_grads);
  // The quantized recipes (MXFP8 and NVFP4 emulated on Hopper), odd token counts and a capacity.
  LayerCase fp8_tensor{"fp8 per-tensor swiglu", 301, 320, 256, 128, 8, 2, 0, 16};
  fp8_tensor.recipe = SFMOE_MOE_RECIPE_FP8_TENSOR;
  cases.push_back(fp8_tensor);
  // (each tensor's per-tensor scale from its own amax: a scale taken from another tensor fails)
  LayerCase apart{
      "fp8 per-tensor swiglu, magnitudes 2^6 to 2^-10 apart", 211, 256, 256, 128, 8, 2, 0, 16};
  apart.recipe = SFMOE_MOE_RECIPE_FP8_TENSOR;
  apart.x_scale = 64.0;
  apart.w2_scale = 1.0 / 1024;
  apart.d_y_scale = 1.0 / 16;
  cases.push_back(apart);
  LayerCase blockwise{"fp8 blockwise swiglu, capacity", 333, 333, 256, 128, 8, 2, 70, 128};
  blockwise.recipe = SFMOE_MOE_RECIPE_FP8_BLOCKWISE;
  cases.push_back(blockwise);
  LayerCase mxfp8{"mxfp8 sigmoid swiglu", 200, 256, 128, 96, 6, 2, 0, 32};
  mxfp8.recipe = SFMOE_MOE_RECIPE_MXFP8;
  mxfp8.sigmoid = true;
  cases.push_back(mxfp8);
  LayerCase nvfp4{
      "nvfp4 squared relu, FP32 main grads", 150, 160, 128, 160, 5, 2, 0, 16, SFMOE_DTYPE_BF16,
      SFMOE_ACTIVATION_SQUARED_RELU};
  nvfp4.recipe = SFMOE_MOE_RECIPE_NVFP4;
  nvfp4.accumulate = true;
  cases.push_back(nvfp4);
  return cases;
}

TEST(CudaMoeLayer, ForwardAndBackwardMatchTheDenseReference) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 301);
  int checked = 0;
  for (const LayerCase& c : device_cases()) {
    SCOPED_TRACE(c.name);
    const LayerProblem p(c, rng);
    const LayerReference r = reference_layer(p);
    sfmoe_moe_layer* layer = nullptr;
    sfmoe_moe_layer_plan plan;
    create_device_layer(c, &layer, &plan);
    if (HasFatalFailure()) return;
    DeviceLayer d(c, p.fc1_cols, plan);
    d.layer = layer;
    d.upload(p);
    if (c.accumulate) {  // main gradients starting at zero
      CUDA_OK(cudaMemset(d.eager.d_w1.ptr, 0, d.eager.d_w1.count));
      CUDA_OK(cudaMemset(d.eager.d_w2.ptr, 0, d.eager.d_w2.count));
    }
    ASSERT_EQ(d.step(d.eager, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    const int64_t T = c.tokens, H = c.hidden;
    const sfmoe_dtype grads = c.accumulate ? SFMOE_DTYPE_FP32 : c.dtype;
    const double tol = recipe_tolerance(c.recipe);
    auto got = [&](const DeviceBuffer<uint8_t>& b, sfmoe_dtype dt, size_t n) {
      const std::vector<uint8_t> bytes = b.download();
      return values_of(dt, bytes.data(), n);
    };
    const double e[] = {mismatch(r.y, got(d.eager.y, c.dtype, T * H)),
                        mismatch(r.d_x, got(d.eager.d_x, c.dtype, T * H)),
                        mismatch(r.d_w1, got(d.eager.d_w1, grads, r.d_w1.size())),
                        mismatch(r.d_w2, got(d.eager.d_w2, grads, r.d_w2.size()))};
    EXPECT_LT(e[0], tol) << "y";
    EXPECT_LT(e[1], tol) << "d_x";
    EXPECT_LT(e[2], tol) << "d_w1";
    EXPECT_LT(e[3], tol) << "d_w2";
    std::printf("[ moe layer ] %-60s mismatch y %.1e d_x %.1e d_w1 %.1e d_w2 %.1e\n",
                c.name.c_str(), e[0], e[1], e[2], e[3]);
    const std::vector<float> dl = d.eager.d_logits.download();
    EXPECT_LT(mismatch(r.d_logits, std::vector<double>(dl.begin(), dl.end())),
              c.recipe == SFMOE_MOE_RECIPE_BF16 ? 1e-3 : 10 * tol)
        << "d_logits";
    EXPECT_EQ(d.eager.kept.download(), r.kept) << "tokens_per_expert";
    sfmoe_moe_layer_destroy(layer);
    ++checked;
  }
  std::printf(
      "[ moe layer ] %d device cases: y, d_x, d_w1, d_w2, d_logits vs the dense reference\n",
      checked);
}

// An emulated recipe whose weight copies the quantizer gives more rows than E n: MXFP8's dgrad
// copy of a weight is columnwise, and at 16384 rows or more its capacity rounds up to a multiple
// of 1024 (E 5 x n 4000 = 20000 -> 20480). The GEMM workspace must hold the decoded copy at that
// capacity (it was planned at E n rows, and the device GEMM refused the call). Zero inputs: the
// step must run, and give zeros.
TEST(CudaMoeLayer, EmulatedWeightCopiesPastExpertRowsFitTheWorkspace) {
  SFMOE_SKIP_WITHOUT_GPU();
  LayerCase c{
      "mxfp8 squared relu, E n past 16384", 64, 64, 4000, 4000, 5, 2, 0, 32, SFMOE_DTYPE_BF16,
      SFMOE_ACTIVATION_SQUARED_RELU};
  c.recipe = SFMOE_MOE_RECIPE_MXFP8;
  sfmoe_moe_layer* layer = nullptr;
  sfmoe_moe_layer_plan plan;
  create_device_layer(c, &layer, &plan);
  if (HasFatalFailure()) return;
  DeviceLayer d(c, c.ffn, plan);
  d.layer = layer;
  for (DeviceBuffer<uint8_t>* b : {&d.x, &d.w1, &d.w2, &d.d_y})
    CUDA_OK(cudaMemset(b->ptr, 0, b->count));
  CUDA_OK(cudaMemset(d.logits.ptr, 0, d.logits.count * sizeof(float)));
  ASSERT_EQ(d.step(d.eager, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  int64_t nonzero = 0;
  for (const uint8_t v : d.eager.d_w1.download()) nonzero += v != 0;
  EXPECT_EQ(nonzero, 0) << "d_w1 of zero inputs";
  std::printf("[ moe layer ] %s: forward and backward ran (workspace %lld bytes)\n", c.name.c_str(),
              static_cast<long long>(plan.workspace_bytes));
  sfmoe_moe_layer_destroy(layer);
}

// FC1's rows gathered from the tokens (SFMOE_LAYER_GATHER_ROWS=1, the own fprop kernel's cp.async
// producers) against permute's copy (=0), each BF16 case of the suite on the device: the same
// bits in every output and gradient (the two runs differ only in how FC1's A rows arrive).
TEST(CudaMoeLayer, GatheredFc1RowsGiveTheBitsOfTheCopiedRows) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 302);
  int checked = 0;
  for (const LayerCase& c : device_cases()) {
    if (c.recipe != SFMOE_MOE_RECIPE_BF16) continue;
    SCOPED_TRACE(c.name);
    const LayerProblem p(c, rng);
    std::vector<std::vector<uint8_t>> bytes[2];
    for (int gather = 0; gather < 2; ++gather) {
      ASSERT_EQ(setenv("SFMOE_LAYER_GATHER_ROWS", gather ? "1" : "0", 1), 0);
      sfmoe_moe_layer_config config = layer_config(c);
      sfmoe_moe_layer* layer = nullptr;
      const sfmoe_status created = sfmoe_moe_layer_create(&config, SFMOE_MEMORY_CUDA, 0, &layer);
      ASSERT_EQ(unsetenv("SFMOE_LAYER_GATHER_ROWS"), 0);
      ASSERT_EQ(created, SFMOE_SUCCESS) << sfmoe_last_error();
      sfmoe_moe_layer_plan plan = sfmoe_moe_layer_plan_init();
      ASSERT_EQ(sfmoe_moe_layer_get_plan(layer, &plan), SFMOE_SUCCESS);
      DeviceLayer d(c, p.fc1_cols, plan);
      d.layer = layer;
      d.upload(p);
      if (c.accumulate) {
        CUDA_OK(cudaMemset(d.eager.d_w1.ptr, 0, d.eager.d_w1.count));
        CUDA_OK(cudaMemset(d.eager.d_w2.ptr, 0, d.eager.d_w2.count));
      }
      ASSERT_EQ(d.step(d.eager, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> dl = d.eager.d_logits.download();
      bytes[gather] = {d.eager.y.download(), d.eager.d_x.download(), d.eager.d_w1.download(),
                       d.eager.d_w2.download(),
                       std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(dl.data()),
                                            reinterpret_cast<const uint8_t*>(dl.data()) +
                                                dl.size() * sizeof(float))};
      sfmoe_moe_layer_destroy(layer);
    }
    const char* names[] = {"y", "d_x", "d_w1", "d_w2", "d_logits"};
    for (int i = 0; i < 5; ++i) EXPECT_EQ(bytes[0][i], bytes[1][i]) << names[i];
    ++checked;
  }
  EXPECT_GT(checked, 0);
  std::printf("[ moe layer ] %d BF16 device cases: gathered FC1 rows bit for bit\n", checked);
}

// Accumulated main gradients change from step to step, so the graph test writes BF16 weight
// gradients (every output then depends on the step's inputs only).
TEST(CudaMoeLayer, OneGraphOfForwardAndBackwardReplaysOnNewTokensAndRoutings) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 302);
  int replays = 0;
  for (LayerCase c : device_cases()) {
    c.accumulate = false;
    SCOPED_TRACE(c.name);
    sfmoe_moe_layer* layer = nullptr;
    sfmoe_moe_layer_plan plan;
    create_device_layer(c, &layer, &plan);
    if (HasFatalFailure()) return;
    LayerProblem p(c, rng);
    DeviceLayer d(c, p.fc1_cols, plan);
    d.layer = layer;
    d.upload(p);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const sfmoe_status captured = d.step(d.graphed, stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    ASSERT_EQ(captured, SFMOE_SUCCESS) << sfmoe_last_error();
    ASSERT_EQ(end, cudaSuccess);
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 10; ++replay) {
      // New tokens, logits (hence routings) and upstream gradients in the captured buffers.
      p = LayerProblem(c, rng);
      d.upload(p);
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      ASSERT_EQ(d.step(d.eager, stream), SFMOE_SUCCESS) << sfmoe_last_error();
      CUDA_OK(cudaStreamSynchronize(stream));
      EXPECT_EQ(d.graphed.y.download(), d.eager.y.download()) << "y, replay " << replay;
      EXPECT_EQ(d.graphed.d_x.download(), d.eager.d_x.download()) << "d_x, replay " << replay;
      EXPECT_EQ(d.graphed.d_w1.download(), d.eager.d_w1.download()) << "d_w1, replay " << replay;
      EXPECT_EQ(d.graphed.d_w2.download(), d.eager.d_w2.download()) << "d_w2, replay " << replay;
      EXPECT_EQ(d.graphed.d_logits.download(), d.eager.d_logits.download())
          << "d_logits, replay " << replay;
      EXPECT_EQ(d.graphed.kept.download(), d.eager.kept.download()) << "counts, replay " << replay;
      ++replays;
    }
    // The last replay against the reference too: the graph computes the layer, not stale bytes.
    const LayerReference r = reference_layer(p);
    const std::vector<uint8_t> y = d.graphed.y.download();
    EXPECT_LT(mismatch(r.y, values_of(c.dtype, y.data(), c.tokens * c.hidden)),
              recipe_tolerance(c.recipe));
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(stream));
    sfmoe_moe_layer_destroy(layer);
  }
  std::printf(
      "[ graph ] moe layer forward + backward: %d replays on new tokens and routings, each "
      "equal to an eager run\n",
      replays);
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

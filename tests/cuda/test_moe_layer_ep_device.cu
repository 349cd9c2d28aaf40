// The MoE layer with expert parallelism over the device loopback: R = 4 and 8 ranks on one GPU
// against the layer without expert parallelism on the same global batch, every output and
// gradient bit for bit (tests/cpp/moe_layer_ep_harness.h; with SPILL's second round the weight
// gradients within FP32 rounding); and the ranks' whole forward and backward, SPILL's two rounds
// included, captured in one CUDA graph, replayed on new routings, checked each replay. And the
// layer over the per-rank transport (NCCL's path; src/cuda/ep/ep_exchange.cu): each rank a
// thread with its own stream, the ranks meeting only in emulated collectives, the same bits.
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "src/cuda/ep/ep_exchange.h"
#include "tests/cpp/moe_layer_ep_harness.h"
#include "tests/cpp/numerics_cases.h"
#include "tests/cuda/ep_emulated_exchange.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

LayerMemory device_memory(cudaStream_t stream) {
  LayerMemory m;
  m.memory = SFMOE_MEMORY_CUDA;
  m.stream = stream;
  m.alloc = [](size_t bytes, uint8_t fill) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes > 0 ? bytes : 1), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, fill, bytes), cudaSuccess);
    // Completed here: the fill and the upload go on the legacy stream, which the ranks'
    // non-blocking streams do not wait for (a slow fill could land after a rank's writes).
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return p;
  };
  m.upload = [](void* to, const void* from, size_t bytes) {
    EXPECT_EQ(cudaMemcpy(to, from, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  m.download = [](void* to, const void* from, size_t bytes) {
    EXPECT_EQ(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  };
  m.release = [](void* p) { cudaFree(p); };
  m.wait = [stream] { EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess); };
  return m;
}

EpLayerCase spill_case() {
  EpLayerCase c{"R 4, SPILL: a first round of 200 rows", {300, 0, 131, 257}, 128, 96, 16, 4, 16};
  c.accumulate = true;
  c.spill_capacity = 200;
  return c;
}

std::vector<EpLayerCase> device_ep_cases() {
  return {
      spill_case(),
      {"R 4, bf16, SwiGLU, an empty rank", {300, 0, 131, 257}, 128, 96, 16, 4, 16},
      {"R 8, sigmoid, k 8, uneven ranks",
       {200, 37, 1, 150, 64, 99, 255, 8},
       256,
       64,
       32,
       8,
       8,
       SFMOE_DTYPE_BF16,
       true},
      {"R 2, accumulate into FP32 main grads, SquaredReLU",
       {77, 190},
       64,
       40,
       8,
       2,
       32,
       SFMOE_DTYPE_BF16,
       false,
       true,
       ActivationKind::kSquaredReLU},
  };
}

TEST(CudaMoeLayerEp, LoopbackRanksEqualTheSingleLayerBitForBit) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 801);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  LayerMemory m = device_memory(stream);
  int checked = 0;
  for (const EpLayerCase& c : device_ep_cases()) {
    SCOPED_TRACE(c.name);
    EpLayerRun run(c, m, rng);
    ASSERT_EQ(run.step(0), SFMOE_SUCCESS) << sfmoe_last_error();
    ASSERT_EQ(run.step(1), SFMOE_SUCCESS) << sfmoe_last_error();
    run.expect_equal("device");
    if (c.spill_capacity > 0) {
      EXPECT_GT(run.spilled(), 0) << "the second round is meant to run";
    }
    ++checked;
  }
  CUDA_OK(cudaStreamDestroy(stream));
  std::printf(
      "[ layer ep ] %d device loopback cases: outputs and gradients equal the single layer\n",
      checked);
}

// The EXTERNAL transport's stages on the device (the collectives made by the test between them,
// the rank read from device memory) equal the loopback and the single layer; and with DROP
// beyond a capacity, the loopback.
TEST(CudaMoeLayerEp, ExternalStagesEqualTheLoopbackBitForBit) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 804);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  LayerMemory m = device_memory(stream);
  std::vector<EpLayerCase> cases = device_ep_cases();
  EpLayerCase drop{"R 4, DROP beyond 40 rows", {300, 17, 131, 257}, 128, 96, 16, 4, 16};
  drop.drop_capacity = 40;
  cases.push_back(drop);
  const int n = expect_external_stages_equal_the_loopback(cases, m, rng);
  CUDA_OK(cudaStreamDestroy(stream));
  std::printf("[ layer ep ] %d EXTERNAL-stage cases on the device: equal to the loopback\n", n);
}

// Determinism on the device: the layer (every recipe, MXFP8 and NVFP4 emulated) and the
// expert-parallel layer, run twice on the same inputs, give the same bits everywhere.
TEST(CudaMoeLayerEp, PerRankTransportEqualsTheSingleLayerBitForBit) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 742);
  LayerMemory m = device_memory(nullptr);
  int checked = 0;
  for (const EpLayerCase& c : device_ep_cases()) {
    SCOPED_TRACE(c.name);
    EpLayerRun run(c, m, rng);
    ASSERT_EQ(run.step(0), SFMOE_SUCCESS) << sfmoe_last_error();
    const int R = static_cast<int>(run.world);
    EmulatedWorld world(R);
    std::vector<layer::MoeLayerShape> shapes(R, run.ep_shape);
    std::vector<layer::MoeLayerPlan> plans(R);
    std::vector<std::unique_ptr<cuda::EpRankTransport>> transports(R);
    std::vector<layer::MoeForwardCall> fwd;
    std::vector<layer::MoeBackwardCall> bwd;
    run.calls(1, &fwd, &bwd);
    for (int r = 0; r < R; ++r) {
      shapes[r].ep_transport = SFMOE_EP_TRANSPORT_NCCL;
      shapes[r].ep_rank = r;
      const Outcome planned = layer::plan_moe_layer(shapes[r], SFMOE_MEMORY_CUDA, &plans[r]);
      ASSERT_TRUE(planned.ok()) << planned.reason;
      const ops::EpLayout& l = plans[r].ep;
      ASSERT_EQ(cuda::EpRankTransport::create(R, r, l.pair_rows, l.staging_row_bytes, l.scale_bytes,
                                              0, std::make_unique<EmulatedExchange>(&world, r),
                                              &transports[r]),
                SFMOE_SUCCESS);
      plans[r].ep_exchange = transports[r]->view();
      // (a rank's own saved state and workspace: its handle is the per-rank one)
      fwd[r].saved = bwd[r].saved = run.alloc(plans[r].saved_bytes, 0xA5);
      fwd[r].workspace = bwd[r].workspace = run.alloc(plans[r].workspace_bytes, 0x5A);
    }
    const bool ran = run_rank_threads(R, [&](int r, cudaStream_t stream) {
      fwd[r].stream = bwd[r].stream = stream;
      const sfmoe_status forward = layer::moe_layer_forward_ranks(shapes[r], plans[r], &fwd[r]);
      if (forward != SFMOE_SUCCESS) return forward;
      return layer::moe_layer_backward_ranks(shapes[r], plans[r], &bwd[r]);
    });
    ASSERT_TRUE(ran);
    CUDA_OK(cudaDeviceSynchronize());
    run.expect_equal("per-rank transport");
    ++checked;
  }
  std::printf(
      "[ moe layer ep ] %d cases over the per-rank transport (ranks as threads): the "
      "single layer's bits\n",
      checked);
}

TEST(CudaMoeLayerEp, TwoRunsGiveTheSameBits) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 803);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  LayerMemory m = device_memory(stream);
  const int checked = expect_two_runs_give_the_same_bits(
      EpLayerCase{"R 4", {500, 0, 257, 1000}, 256, 384, 16, 4, 128}, m, rng);
  CUDA_OK(cudaStreamDestroy(stream));
  std::printf(
      "[ determinism ] %d device runs (5 recipes, with and without EP): the same bits "
      "twice\n",
      checked);
}

TEST(CudaMoeLayerEp, OneGraphReplaysOnNewRoutings) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 802);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  LayerMemory m = device_memory(stream);
  const EpLayerCase c = spill_case();  // both rounds in the graph
  EpLayerRun run(c, m, rng);
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  ASSERT_EQ(run.step(1), SFMOE_SUCCESS) << sfmoe_last_error();
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 4; ++replay) {
    run.new_logits(rng);  // new routings, the same buffers (both layers read them)
    CUDA_OK(cudaGraphLaunch(exec, stream));
    ASSERT_EQ(run.step(0), SFMOE_SUCCESS) << sfmoe_last_error();
    run.expect_equal("replay " + std::to_string(replay));
    EXPECT_GT(run.spilled(), 0);
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  std::printf(
      "[ graph ] layer with loopback EP (R 4, SPILL), forward + backward: 4 replays on new "
      "routings\n");
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

// Expert parallelism's device loopback (include/sfmoe/ep.h) against the CPU backend, the
// definition (tests/cpp/test_ep_cpu.cpp checks that against an independent all-to-all): the same
// inputs through both, every output compared byte for byte over buffers poisoned alike; R = 1, 2,
// 4, 8, skewed routings, empty ranks, capacities below demand, SPILL's second round, BF16 and FP32
// payloads, FP8 codes with their scales (per-tensor, 1x128, MXFP8; dispatch only); and
// dispatch -> combine -> combine's backward captured in one CUDA graph, replayed on new routings
// and checked each replay.
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sfmoe/ep.h"
#include "tests/cuda/ep_device_harness.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

TEST(CudaEpLoopback, DispatchCombineAndBackwardEqualTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 601);
  int checked = 0;
  for (const DeviceEpCase& c : device_cases()) {
    SCOPED_TRACE(c.name);
    sfmoe_ep_group* host = make_group(c, SFMOE_MEMORY_HOST);
    sfmoe_ep_group* device = make_group(c, SFMOE_MEMORY_CUDA);
    ASSERT_NE(host, nullptr);
    ASSERT_NE(device, nullptr);
    sfmoe_ep_plan plan = sfmoe_ep_plan_init();
    ASSERT_EQ(sfmoe_ep_group_get_plan(device, &plan), SFMOE_SUCCESS);
    EpRun run(c, plan, rng);
    ASSERT_EQ(run.step(host, SFMOE_MEMORY_HOST, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
    ASSERT_EQ(run.step(device, SFMOE_MEMORY_CUDA, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    run.expect_same("eager");
    int64_t dropped = 0, spilled = 0;
    for (int64_t r = 0; r < c.world; ++r) {
      std::vector<int64_t> v(c.world * c.experts_per_rank);
      memcpy(v.data(), run.dropped[r].host.data(), v.size() * 8);
      for (int64_t n : v) dropped += n;
      std::vector<int64_t> kept(plan.rounds * c.experts_per_rank);
      memcpy(kept.data(), run.kept[r].host.data(), kept.size() * 8);
      for (size_t g = c.experts_per_rank; g < kept.size(); ++g) spilled += kept[g];
    }
    if (c.capacity != SFMOE_EP_CAPACITY_WORST_CASE && c.spill != SFMOE_EP_CAPACITY_WORST_CASE) {
      EXPECT_GT(dropped, 0) << "the capacity binds";
    }
    if (c.overflow == SFMOE_EP_OVERFLOW_SPILL) EXPECT_GT(spilled, 0) << "the second round runs";
    if (c.spill == SFMOE_EP_CAPACITY_WORST_CASE) EXPECT_EQ(dropped, 0);
    sfmoe_ep_group_destroy(host);
    sfmoe_ep_group_destroy(device);
    ++checked;
  }
  std::printf("[ ep ] %d device loopback cases: every output byte-equal to the CPU backend\n",
              checked);
}

TEST(CudaEpLoopback, OneGraphReplaysOnNewRoutings) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 602);
  const DeviceEpCase c = device_cases()[4];  // SPILL: both rounds in the graph
  sfmoe_ep_group* host = make_group(c, SFMOE_MEMORY_HOST);
  sfmoe_ep_group* device = make_group(c, SFMOE_MEMORY_CUDA);
  sfmoe_ep_plan plan = sfmoe_ep_plan_init();
  ASSERT_EQ(sfmoe_ep_group_get_plan(device, &plan), SFMOE_SUCCESS);
  EpRun run(c, plan, rng);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  ASSERT_EQ(run.step(device, SFMOE_MEMORY_CUDA, stream), SFMOE_SUCCESS) << sfmoe_last_error();
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  const int64_t E = c.world * c.experts_per_rank;
  for (int replay = 0; replay < 5; ++replay) {
    for (int64_t r = 0; r < c.world; ++r) {  // new routings, the same buffers
      run.ids[r].reset_to(bytes_of(route(rng, run.tokens[r], E, c.top_k, replay % 2 == 0)));
    }
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_EQ(run.step(host, SFMOE_MEMORY_HOST, nullptr), SFMOE_SUCCESS);
    run.expect_same("replay " + std::to_string(replay));
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  sfmoe_ep_group_destroy(host);
  sfmoe_ep_group_destroy(device);
  std::printf("[ graph ] ep loopback dispatch + combine + backward: 5 replays on new routings\n");
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

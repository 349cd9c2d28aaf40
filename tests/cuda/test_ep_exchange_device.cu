// Expert parallelism with one rank a process (the NCCL transport's routing and moves,
// src/cuda/ep/ep_exchange.cu) against the CPU backend's loopback, the definition: R ranks run as
// threads of this process on one GPU, each with its own group, stream and buffers, meeting only
// in the exchange's collectives (emulated here with device copies ordered by events, as NCCL
// orders its own); every output byte-equal to the loopback's for R = 1, 2, 4, 8 over the loopback
// tests' cases (capacities below demand, SPILL, empty ranks, FP8 payloads with their scales) and
// adversarial routings (every token on one expert, one rank with every token). Then the real
// thing on one GPU: a one-rank NCCL communicator from a unique id, the step captured in one CUDA
// graph with NCCL's collectives in it and replayed on new routings, checked each replay; and the
// NCCL configuration's errors.
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sfmoe/ep.h"
#include "sfmoe/moe_layer.h"
#include "src/api/ep_config.h"
#include "src/common/ep_args.h"
#include "tests/cuda/ep_device_harness.h"
#include "tests/cuda/ep_emulated_exchange.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

sfmoe_ep_config per_rank_config(const DeviceEpCase& c, int32_t rank) {
  sfmoe_ep_config config = config_of(c);
  config.transport = SFMOE_EP_TRANSPORT_NCCL;
  config.rank = rank;
  return config;
}

// The cases of the loopback tests, and routings no random draw gives.
std::vector<DeviceEpCase> exchange_cases() {
  std::vector<DeviceEpCase> cases = device_cases();
  cases.push_back({"R 4 bf16, one expert takes every token (k 1), capacity binds", 4, 3, 90, 1, 48,
                   16, 100, SFMOE_DTYPE_BF16, false, false});
  cases.push_back({"R 2 fp16, k > E_l, odd H, trap", 2, 3, 61, 5, 19, 8, 70, SFMOE_DTYPE_FP16, true,
                   false, SFMOE_EP_OVERFLOW_TRAP});
  DeviceEpCase pair{"R 4 bf16, a pair capacity of 40 rows binds, skewed",
                    4,
                    4,
                    120,
                    4,
                    64,
                    16,
                    SFMOE_EP_CAPACITY_WORST_CASE,
                    SFMOE_DTYPE_BF16,
                    true,
                    false};
  pair.pair = 40;
  cases.push_back(pair);
  DeviceEpCase pair_spill{"R 8 bf16, SPILL and a pair capacity of 25",
                          8,
                          2,
                          64,
                          3,
                          32,
                          8,
                          100,
                          SFMOE_DTYPE_BF16,
                          false,
                          false,
                          SFMOE_EP_OVERFLOW_SPILL,
                          SFMOE_EP_CAPACITY_WORST_CASE};
  pair_spill.pair = 25;
  cases.push_back(pair_spill);
  return cases;
}

// Every token of rank r on global expert `expert` (k = 1), or every rank's tokens on rank 0's
// experts.
void concentrate(EpRun& run, const DeviceEpCase& c) {
  for (int64_t r = 0; r < c.world; ++r) {
    std::vector<int32_t> ids(run.tokens[r] * c.top_k);
    for (int64_t t = 0; t < run.tokens[r]; ++t) {
      for (int64_t i = 0; i < c.top_k; ++i) ids[t * c.top_k + i] = static_cast<int32_t>(i);
    }
    run.ids[r].reset_to(bytes_of(ids));
  }
}

TEST(CudaEpExchange, RanksMeetingInCollectivesEqualTheLoopback) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 611);
  int checked = 0;
  for (const DeviceEpCase& c : exchange_cases()) {
    SCOPED_TRACE(c.name);
    sfmoe_ep_group* host = make_group(c, SFMOE_MEMORY_HOST);
    ASSERT_NE(host, nullptr);
    EmulatedWorld world(c.world);
    std::vector<sfmoe_ep_group*> groups(c.world, nullptr);
    for (int32_t r = 0; r < c.world; ++r) {
      const sfmoe_ep_config config = per_rank_config(c, r);
      ASSERT_EQ(
          ep_group_create_with_exchange(&config, SFMOE_MEMORY_CUDA, 0,
                                        std::make_unique<EmulatedExchange>(&world, r), &groups[r]),
          SFMOE_SUCCESS)
          << sfmoe_last_error();
    }
    sfmoe_ep_plan plan = sfmoe_ep_plan_init(), loopback = sfmoe_ep_plan_init();
    ASSERT_EQ(sfmoe_ep_group_get_plan(groups[0], &plan), SFMOE_SUCCESS);
    ASSERT_EQ(sfmoe_ep_group_get_plan(host, &loopback), SFMOE_SUCCESS);
    EXPECT_EQ(plan.local_ranks, 1);
    EXPECT_EQ(plan.receive_rows, loopback.receive_rows);
    EXPECT_GT(plan.pair_rows, 0);
    EXPECT_GT(plan.staging_bytes, 0);
    EpRun run(c, plan, rng);
    if (c.top_k == 1) concentrate(run, c);
    ASSERT_EQ(run.step(host, SFMOE_MEMORY_HOST, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
    run_rank_threads(c.world, [&](int r, cudaStream_t stream) {
      return run.step(groups[r], SFMOE_MEMORY_CUDA, stream, r);
    });
    run.expect_same("exchange");
    int64_t dropped = 0;
    for (int64_t r = 0; r < c.world; ++r) {
      std::vector<int64_t> v(c.world * c.experts_per_rank);
      memcpy(v.data(), run.dropped[r].host.data(), v.size() * 8);
      for (int64_t n : v) dropped += n;
    }
    if ((c.capacity != SFMOE_EP_CAPACITY_WORST_CASE && c.spill != SFMOE_EP_CAPACITY_WORST_CASE) ||
        c.pair > 0) {
      EXPECT_GT(dropped, 0) << "the capacity binds";
    }
    for (sfmoe_ep_group* g : groups) sfmoe_ep_group_destroy(g);
    sfmoe_ep_group_destroy(host);
    ++checked;
  }
  std::printf(
      "[ ep ] %d per-rank cases (ranks as threads meeting in collectives): every output "
      "byte-equal to the loopback\n",
      checked);
}

// A one-rank NCCL group, or a skip when this machine has no NCCL.
sfmoe_ep_group* nccl_group(const DeviceEpCase& c, std::string* skip) {
  uint8_t id[SFMOE_EP_NCCL_UNIQUE_ID_BYTES];
  const sfmoe_status made = sfmoe_ep_nccl_unique_id(id);
  if (made == SFMOE_ERROR_UNSUPPORTED) {
    *skip = sfmoe_last_error();
    return nullptr;
  }
  EXPECT_EQ(made, SFMOE_SUCCESS) << sfmoe_last_error();
  sfmoe_ep_config config = per_rank_config(c, 0);
  config.nccl_unique_id = id;
  sfmoe_ep_group* g = nullptr;
  EXPECT_EQ(sfmoe_ep_group_create(&config, SFMOE_MEMORY_CUDA, 0, &g), SFMOE_SUCCESS)
      << sfmoe_last_error();
  return g;
}

TEST(CudaEpNccl, OneRankCommunicatorInOneGraphReplaysOnNewRoutings) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 612);
  DeviceEpCase c = device_cases()[0];  // R 1
  c.capacity = 700;                    // below the demand: drops in the graph too
  c.overflow = SFMOE_EP_OVERFLOW_SPILL;
  c.spill = 200;
  std::string skip;
  sfmoe_ep_group* device = nccl_group(c, &skip);
  if (device == nullptr && !skip.empty()) GTEST_SKIP() << "no NCCL on this machine: " << skip;
  ASSERT_NE(device, nullptr);
  sfmoe_ep_group* host = make_group(c, SFMOE_MEMORY_HOST);
  sfmoe_ep_plan plan = sfmoe_ep_plan_init();
  ASSERT_EQ(sfmoe_ep_group_get_plan(device, &plan), SFMOE_SUCCESS);
  EpRun run(c, plan, rng);
  ASSERT_EQ(run.step(host, SFMOE_MEMORY_HOST, nullptr), SFMOE_SUCCESS);
  ASSERT_EQ(run.step(device, SFMOE_MEMORY_CUDA, nullptr, 0), SFMOE_SUCCESS) << sfmoe_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  run.expect_same("eager");
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  ASSERT_EQ(run.step(device, SFMOE_MEMORY_CUDA, stream, 0), SFMOE_SUCCESS) << sfmoe_last_error();
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 5; ++replay) {
    run.ids[0].reset_to(bytes_of(
        route(rng, run.tokens[0], c.world * c.experts_per_rank, c.top_k, replay % 2 == 0)));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_EQ(run.step(host, SFMOE_MEMORY_HOST, nullptr), SFMOE_SUCCESS);
    run.expect_same("replay " + std::to_string(replay));
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  sfmoe_ep_group_destroy(device);
  sfmoe_ep_group_destroy(host);
  std::printf("[ graph ] NCCL one-rank dispatch + combine + backward (SPILL): 5 replays\n");
}

TEST(CudaEpNccl, BadConfigurationsAreRefused) {
  SFMOE_SKIP_WITHOUT_GPU();
  const DeviceEpCase c = device_cases()[2];  // R 4
  auto refused = [&](sfmoe_ep_config bad, sfmoe_status status, const char* words) {
    sfmoe_ep_group* g = nullptr;
    EXPECT_EQ(sfmoe_ep_group_create(&bad, SFMOE_MEMORY_CUDA, 0, &g), status);
    EXPECT_NE(std::string(sfmoe_last_error()).find(words), std::string::npos) << sfmoe_last_error();
    EXPECT_EQ(g, nullptr);
  };
  sfmoe_ep_config bad = per_rank_config(c, 1);  // neither an id nor a communicator
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "exactly one");
  uint8_t id[SFMOE_EP_NCCL_UNIQUE_ID_BYTES] = {};
  int comm = 0;
  bad.nccl_unique_id = id;
  bad.nccl_comm = &comm;  // both
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "exactly one");
  bad = per_rank_config(c, 4);
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "outside the world");
  bad = per_rank_config(c, 0);
  bad.world_size = 65;
  bad.nccl_unique_id = id;
  refused(bad, SFMOE_ERROR_UNSUPPORTED, "64 ranks");
  bad = config_of(c);  // the device loopback takes no pair capacity
  bad.pair_capacity = 16;
  refused(bad, SFMOE_ERROR_UNSUPPORTED, "pair_capacity");
  // Combine rows wider than the staging's rows.
  EmulatedWorld world(1);
  DeviceEpCase one = device_cases()[0];
  sfmoe_ep_config config = per_rank_config(one, 0);
  sfmoe_ep_group* g = nullptr;
  ASSERT_EQ(ep_group_create_with_exchange(&config, SFMOE_MEMORY_CUDA, 0,
                                          std::make_unique<EmulatedExchange>(&world, 0), &g),
            SFMOE_SUCCESS);
  sfmoe_ep_plan plan = sfmoe_ep_plan_init();
  ASSERT_EQ(sfmoe_ep_group_get_plan(g, &plan), SFMOE_SUCCESS);
  const int64_t T = 4, H = one.hidden;
  DeviceBuffer<float> rows(plan.receive_rows * H), out(T * H);
  DeviceBuffer<uint8_t> handle(plan.handle_bytes);
  sfmoe_tensor t_rows =
      tensor_in(SFMOE_MEMORY_CUDA, rows.ptr, SFMOE_DTYPE_FP32, {plan.receive_rows, H});
  sfmoe_tensor t_out = tensor_in(SFMOE_MEMORY_CUDA, out.ptr, SFMOE_DTYPE_FP32, {T, H});
  sfmoe_tensor t_handle = tensor_in(SFMOE_MEMORY_CUDA, handle.ptr, kBytes, {plan.handle_bytes});
  const sfmoe_tensor* p_rows = &t_rows;
  const sfmoe_tensor* p_out = &t_out;
  const sfmoe_tensor* p_handle = &t_handle;
  sfmoe_ep_combine_args cb = sfmoe_ep_combine_args_init();
  cb.rows = &p_rows;
  cb.out = &p_out;
  cb.handle = &p_handle;
  EXPECT_EQ(sfmoe_ep_combine(g, &cb), SFMOE_ERROR_UNSUPPORTED);  // FP32 rows, BF16 staging
  EXPECT_NE(std::string(sfmoe_last_error()).find("staging"), std::string::npos)
      << sfmoe_last_error();
  sfmoe_ep_group_destroy(g);
}

// The MoE layer over an NCCL group: the group's bounds must be the layer's, its capacities and
// policy replace the layer's ep_* fields; a loopback group is refused.
TEST(CudaEpNccl, TheLayerTakesAMatchingGroupOnly) {
  SFMOE_SKIP_WITHOUT_GPU();
  DeviceEpCase c = device_cases()[0];  // R 1: 16 experts, 300 tokens, k 4, H 264, alignment 16
  c.capacity = 500;
  std::string skip;
  sfmoe_ep_group* group = nccl_group(c, &skip);
  if (group == nullptr && !skip.empty()) GTEST_SKIP() << "no NCCL on this machine: " << skip;
  ASSERT_NE(group, nullptr);
  sfmoe_moe_layer_config config = sfmoe_moe_layer_config_init();
  config.hidden = c.hidden;
  config.ffn_hidden = 64;
  config.num_experts = c.experts_per_rank;
  config.max_tokens = c.max_tokens;
  config.router.top_k = c.top_k;
  config.row_alignment = c.alignment;
  config.ep_world_size = 1;
  config.ep_group = group;
  sfmoe_moe_layer* layer = nullptr;
  ASSERT_EQ(sfmoe_moe_layer_create(&config, SFMOE_MEMORY_CUDA, 0, &layer), SFMOE_SUCCESS)
      << sfmoe_last_error();
  sfmoe_moe_layer_plan plan = sfmoe_moe_layer_plan_init();
  ASSERT_EQ(sfmoe_moe_layer_get_plan(layer, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.local_ranks, 1);
  EXPECT_EQ(plan.local_experts, c.experts_per_rank);
  sfmoe_ep_plan group_plan = sfmoe_ep_plan_init();
  ASSERT_EQ(sfmoe_ep_group_get_plan(group, &group_plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.row_capacity, group_plan.receive_rows) << "the group's capacity, not the worst";
  sfmoe_moe_layer_destroy(layer);
  auto refused = [&](sfmoe_moe_layer_config bad, sfmoe_status status, const char* words) {
    sfmoe_moe_layer* l = nullptr;
    EXPECT_EQ(sfmoe_moe_layer_create(&bad, SFMOE_MEMORY_CUDA, 0, &l), status);
    EXPECT_NE(std::string(sfmoe_last_error()).find(words), std::string::npos) << sfmoe_last_error();
    EXPECT_EQ(l, nullptr);
  };
  sfmoe_moe_layer_config bad = config;
  bad.hidden = c.hidden + 8;
  refused(bad, SFMOE_ERROR_SHAPE_MISMATCH, "ep_group was made for");
  bad = config;
  bad.max_tokens = c.max_tokens - 1;
  refused(bad, SFMOE_ERROR_SHAPE_MISMATCH, "ep_group was made for");
  bad = config;
  bad.ep_receive_capacity = 100;  // the group's capacity applies
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "defaults");
  bad = config;
  bad.ep_world_size = 2;
  refused(bad, SFMOE_ERROR_SHAPE_MISMATCH, "ep_group was made for");
  sfmoe_ep_group* loopback = make_group(c, SFMOE_MEMORY_CUDA);
  bad = config;
  bad.ep_group = loopback;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "NCCL group");
  sfmoe_ep_group_destroy(loopback);
  sfmoe_ep_group_destroy(group);
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

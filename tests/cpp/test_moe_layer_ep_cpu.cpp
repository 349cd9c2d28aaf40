// The MoE layer with expert parallelism over the loopback transport on the CPU backend: R = 2 and
// 4 ranks against the layer without expert parallelism on the same global batch, every output
// and gradient bit for bit (tests/cpp/moe_layer_ep_harness.h), an empty rank and uneven token
// counts among them.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "tests/cpp/moe_layer_ep_harness.h"
#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace testing {
namespace {

LayerMemory host_memory() {
  LayerMemory m;
  m.memory = SFMOE_MEMORY_HOST;
  m.alloc = [](size_t bytes, uint8_t fill) {
    void* p = std::malloc(bytes > 0 ? bytes : 1);
    std::memset(p, fill, bytes);
    return p;
  };
  m.upload = [](void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); };
  m.download = [](void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); };
  m.release = [](void* p) { std::free(p); };
  m.wait = [] {};
  return m;
}

TEST(MoeLayerEp, LoopbackRanksEqualTheSingleLayerBitForBit) {
  std::mt19937_64 rng(session_test_seed() + 701);
  std::vector<EpLayerCase> cases;
  cases.push_back({"R 4, bf16, SwiGLU, an empty rank", {13, 0, 7, 21}, 24, 16, 8, 2, 8});
  EpLayerCase fp32{"R 2, fp32, sigmoid, GeLU, accumulate", {9, 17}, 20, 12, 6, 3, 1,
                   SFMOE_DTYPE_FP32, true, true, ActivationKind::kGeLU};
  cases.push_back(fp32);
  cases.push_back({"R 4, one expert per rank, k 3", {5, 11, 3, 8}, 16, 8, 4, 3, 16});
  LayerMemory m = host_memory();
  for (const EpLayerCase& c : cases) {
    SCOPED_TRACE(c.name);
    EpLayerRun run(c, m, rng);
    ASSERT_EQ(run.step(0), SFMOE_SUCCESS) << sfmoe_last_error();
    ASSERT_EQ(run.step(1), SFMOE_SUCCESS) << sfmoe_last_error();
    run.expect_equal("host");
  }
  std::printf("[ layer ep ] %zu loopback cases: outputs and gradients equal the single layer\n",
              cases.size());
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

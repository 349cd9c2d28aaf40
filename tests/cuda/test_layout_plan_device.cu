// The planning functions against the CUDA backend: the kernels accept the planned layouts and
// write nothing past them (tests/cpp/layout_plan_cases.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tests/cpp/layout_plan_cases.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

// Device memory, freed with the space; copies are synchronous (the checks read results back).
struct DeviceSpace {
  std::vector<void*> blocks;
  MemorySpace space;
  DeviceSpace() {
    space.memory = SFMOE_MEMORY_CUDA;
    space.allocate = [this](size_t bytes) {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) p = nullptr;
      blocks.push_back(p);
      return p;
    };
    space.upload = [](void* to, const void* from, size_t n) {
      EXPECT_EQ(cudaMemcpy(to, from, n, cudaMemcpyHostToDevice), cudaSuccess);
    };
    space.download = [](void* to, const void* from, size_t n) {
      EXPECT_EQ(cudaMemcpy(to, from, n, cudaMemcpyDeviceToHost), cudaSuccess);
    };
    space.synchronize = [] { EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess); };
  }
  ~DeviceSpace() {
    for (void* p : blocks) cudaFree(p);
  }
};

uint32_t fresh_seed() {
  const uint32_t seed = std::random_device{}();
  std::printf("[ plan ] seed %u\n", seed);
  return seed;
}

TEST(CudaLayoutPlan, QuantizeOutputsHoldWhatTheKernelsWrite) {
  SFMOE_SKIP_WITHOUT_GPU();
  DeviceSpace device;
  check_quantize_plans(device.space, fresh_seed());
}

TEST(CudaLayoutPlan, PermuteOutputsHoldWhatTheKernelsWrite) {
  SFMOE_SKIP_WITHOUT_GPU();
  DeviceSpace device;
  check_permute_plans(device.space, fresh_seed());
}

TEST(CudaLayoutPlan, ActivationOutputsHoldWhatTheKernelsWrite) {
  SFMOE_SKIP_WITHOUT_GPU();
  DeviceSpace device;
  check_activation_plans(device.space, fresh_seed());
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

// The adversarial cases (tests/cpp/adversarial_cases.h) on the CUDA backend: the same calls on
// device buffers, on a stream. Run under compute-sanitizer memcheck by tools/sanitize.sh, which
// also catches reads outside the buffers (the guards catch writes).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "tests/cpp/adversarial_cases.h"
#include "tests/cuda/device_arena.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

class AdversarialDevice : public ::testing::TestWithParam<AdversarialCase> {};

TEST_P(AdversarialDevice, SpecificFaultAndNothingWrittenOutsideTheOutputs) {
  SFMOE_SKIP_WITHOUT_GPU();
  {
    DeviceArena arena;
    GetParam().run(arena);
    EXPECT_EQ(arena.damage(), "");
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
}

INSTANTIATE_TEST_SUITE_P(Cases, AdversarialDevice, ::testing::ValuesIn(adversarial_cases()),
                         [](const ::testing::TestParamInfo<AdversarialCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace testing
}  // namespace sfmoe

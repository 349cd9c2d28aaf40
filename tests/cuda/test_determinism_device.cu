// Every op twice on the CUDA backend, same inputs, fresh device buffers: the same bytes
// (tests/cpp/determinism_cases.h). The seed is fresh each run and printed on failure.
#include <gtest/gtest.h>

#include <random>

#include "tests/cpp/determinism_cases.h"
#include "tests/cuda/device_arena.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

class DeterminismDevice : public ::testing::TestWithParam<DeterminismCase> {};

TEST_P(DeterminismDevice, TwiceTheSameBytes) {
  SFMOE_SKIP_WITHOUT_GPU();
  expect_twice_the_same_bytes(GetParam(), std::random_device{}(),
                              [] { return std::unique_ptr<Arena>(new DeviceArena()); });
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Ops, DeterminismDevice, ::testing::ValuesIn(determinism_cases()),
                         [](const ::testing::TestParamInfo<DeterminismCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace testing
}  // namespace sfmoe

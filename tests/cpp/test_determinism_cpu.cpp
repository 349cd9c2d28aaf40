// Every op twice on the CPU backend, same inputs, fresh buffers: the same bytes
// (tests/cpp/determinism_cases.h). The seed is fresh each run and printed on failure.
#include <gtest/gtest.h>

#include <random>

#include "tests/cpp/determinism_cases.h"

namespace sfmoe {
namespace testing {
namespace {

class DeterminismCpu : public ::testing::TestWithParam<DeterminismCase> {};

TEST_P(DeterminismCpu, TwiceTheSameBytes) {
  expect_twice_the_same_bytes(GetParam(), std::random_device{}(),
                              [] { return std::unique_ptr<Arena>(new HostArena()); });
}

INSTANTIATE_TEST_SUITE_P(Ops, DeterminismCpu, ::testing::ValuesIn(determinism_cases()),
                         [](const ::testing::TestParamInfo<DeterminismCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace testing
}  // namespace sfmoe

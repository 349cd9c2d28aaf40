// Every op twice on the CPU backend, same inputs, fresh buffers: the same bytes
// (tests/cpp/determinism_cases.h). The seed is fresh each run and printed on failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "tests/cpp/determinism_cases.h"

namespace sfmoe {
namespace testing {
namespace {

class DeterminismCpu : public ::testing::TestWithParam<DeterminismCase> {};

TEST_P(DeterminismCpu, TwiceTheSameBytes) {
  const uint32_t seed = std::random_device{}();
  OutputBytes first, second;
  {
    HostArena arena;
    first = GetParam().run(arena, seed);
    EXPECT_EQ(arena.damage(), "");
  }
  {
    HostArena arena;
    second = GetParam().run(arena, seed);
  }
  ASSERT_FALSE(first.empty());
  ASSERT_EQ(first.size(), second.size());
  // The op wrote its first output (not one byte value throughout, as the fill is).
  const std::vector<uint8_t>& main = first[0];
  EXPECT_NE(std::count(main.begin(), main.end(), main.empty() ? 0 : main[0]),
            static_cast<std::ptrdiff_t>(main.size()));
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i] == second[i], true) << "output " << i << " differs, seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, DeterminismCpu, ::testing::ValuesIn(determinism_cases()),
                         [](const ::testing::TestParamInfo<DeterminismCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace testing
}  // namespace sfmoe

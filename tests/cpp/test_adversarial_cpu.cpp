// The adversarial cases (tests/cpp/adversarial_cases.h) on the CPU backend.
#include <gtest/gtest.h>

#include "tests/cpp/adversarial_cases.h"

namespace sfmoe {
namespace testing {
namespace {

class AdversarialCpu : public ::testing::TestWithParam<AdversarialCase> {};

TEST_P(AdversarialCpu, SpecificOutcomeAndNothingWrittenOutsideTheOutputs) {
  HostArena arena;
  GetParam().run(arena);
  EXPECT_EQ(arena.damage(), "");
}

INSTANTIATE_TEST_SUITE_P(Cases, AdversarialCpu, ::testing::ValuesIn(adversarial_cases()),
                         [](const ::testing::TestParamInfo<AdversarialCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(AdversarialCpu, AtLeastThirtyDistinctCases) { EXPECT_GE(adversarial_cases().size(), 30u); }

}  // namespace
}  // namespace testing
}  // namespace sfmoe

// Determinism of every op: each case runs an op (or a forward with its backward) on inputs drawn
// from a seed and returns the bytes of every output. The suites (tests/cpp/test_determinism_cpu.cpp
// and tests/cuda/test_determinism_device.cu) run each case twice with the same seed, in fresh
// arenas (other addresses), and require the same bytes. Sizes are larger on the device, where
// several blocks, chunked scans and atomics take part.
#pragma once

#include <gtest/gtest.h>
#include <stdint.h>

#include <memory>
#include <vector>

#include "tests/cpp/guarded_arena.h"

namespace sfmoe {
namespace testing {

using OutputBytes = std::vector<std::vector<uint8_t>>;

struct DeterminismCase {
  const char* name;
  OutputBytes (*run)(Arena& arena, uint32_t seed);
};

const std::vector<DeterminismCase>& determinism_cases();

// Runs `c` twice from one fresh seed, each run in a fresh arena from `make_arena` (the first run's
// guards and inputs checked), and expects the same bytes in every output, the first of them
// written (not one byte value throughout, as a fill is).
template <class MakeArena>
void expect_twice_the_same_bytes(const DeterminismCase& c, uint32_t seed, MakeArena make_arena) {
  OutputBytes first, second;
  {
    std::unique_ptr<Arena> arena = make_arena();
    first = c.run(*arena, seed);
    EXPECT_EQ(arena->damage(), "");
  }
  {
    std::unique_ptr<Arena> arena = make_arena();
    second = c.run(*arena, seed);
  }
  ASSERT_FALSE(first.empty());
  ASSERT_EQ(first.size(), second.size());
  const std::vector<uint8_t>& main = first[0];
  size_t same = 0;
  for (uint8_t b : main) same += b == main[0];
  EXPECT_NE(same, main.size()) << "the first output was not written";
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i] == second[i], true) << "output " << i << " differs, seed " << seed;
  }
}

}  // namespace testing
}  // namespace sfmoe

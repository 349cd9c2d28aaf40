// Determinism of every op: each case runs an op (or a forward with its backward) on inputs drawn
// from a seed and returns the bytes of every output. The suites (tests/cpp/test_determinism_cpu.cpp
// and tests/cuda/test_determinism_device.cu) run each case twice with the same seed, in fresh
// arenas (other addresses), and require the same bytes. Sizes are larger on the device, where
// several blocks, chunked scans and atomics take part.
#pragma once

#include <stdint.h>

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

}  // namespace testing
}  // namespace sfmoe

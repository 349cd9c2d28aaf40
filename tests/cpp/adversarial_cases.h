// Adversarial device-side sizes: offsets, counts, ids, row maps and values that break the ops'
// contracts, given to every op that reads them from its tensors' memory. One table of cases runs
// on the CPU backend (tests/cpp/test_adversarial_cpu.cpp) and on the CUDA backend
// (tests/cuda/test_adversarial_device.cu), where the same calls take device buffers.
//
// Every buffer a case hands an op sits between two guard regions; after the case, the harness
// checks that no guard changed and that no input changed. Each case asserts the outcome its
// backend documents: the host refuses bad ids and offsets with a specific status before writing
// anything (the outputs keep their fill bytes), except where it clamps as the device does; the
// device clamps or skips, carries on, and raises one specific set of fault flags in the status
// word.
#pragma once

#include <vector>

#include "tests/cpp/guarded_arena.h"

namespace sfmoe {
namespace testing {

struct AdversarialCase {
  const char* name;
  void (*run)(Arena& arena);
};

// Every case; names are unique and valid gtest parameter names.
const std::vector<AdversarialCase>& adversarial_cases();

}  // namespace testing
}  // namespace sfmoe

// Recording a fault in a status word, from host code (CPU backend) or a kernel (CUDA backend).
#pragma once

#include "sfmoe/numerics/bits.h"
#include "sfmoe/sfmoe.h"

namespace sfmoe {

SFMOE_HD void raise_fault(sfmoe_fault_report* word, uint32_t flag, int64_t group, int64_t value) {
#if defined(__CUDA_ARCH__)
  atomicOr(&word->flags, flag);
  // Saturating count: a wrapped counter would read as "few faults".
  unsigned int seen = word->count;
  while (seen != 0xFFFFFFFFu) {
    const unsigned int prior = atomicCAS(&word->count, seen, seen + 1u);
    if (prior == seen) break;
    seen = prior;
  }
  static_assert(sizeof(unsigned long long) == sizeof(int64_t), "64-bit CAS");
  const unsigned long long unset = static_cast<unsigned long long>(-1LL);
  if (atomicCAS(reinterpret_cast<unsigned long long*>(&word->first_group), unset,
                static_cast<unsigned long long>(group)) == unset) {
    word->first_value = value;
  }
#else
  word->flags |= flag;
  if (word->count != 0xFFFFFFFFu) ++word->count;
  if (word->first_group == -1) {
    word->first_group = group;
    word->first_value = value;
  }
#endif
}

}  // namespace sfmoe

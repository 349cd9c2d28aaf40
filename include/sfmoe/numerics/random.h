// Counter-based random bits for stochastic rounding: Philox4x32-10 (Salmon et al., SC'11), so a
// result depends only on (seed, offset, element index) and is reproducible on any backend,
// any launch shape, any number of runs.
#pragma once

#include "sfmoe/numerics/bits.h"

namespace sfmoe {
namespace numerics {

struct Philox4x32 {
  uint32_t v[4];
};

SFMOE_HD void mul_hi_lo_32(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// Ten rounds of Philox4x32 on a 128-bit counter with a 64-bit key.
SFMOE_HD Philox4x32 philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo_32(kMul0, counter.v[0], &hi0, &lo0);
    mul_hi_lo_32(kMul1, counter.v[2], &hi1, &lo1);
    const Philox4x32 next = {{hi1 ^ counter.v[1] ^ key0, lo1, hi0 ^ counter.v[3] ^ key1, lo0}};
    counter = next;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// The random bits of elements 4q .. 4q + 3 of a stream (seed, offset): counter (q as 64 bits,
// offset as 64 bits), key = seed; word k belongs to element 4q + k.
SFMOE_HD Philox4x32 philox_random_quad(uint64_t seed, uint64_t offset, uint64_t quad) {
  const Philox4x32 counter = {{static_cast<uint32_t>(quad), static_cast<uint32_t>(quad >> 32),
                               static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}};
  return philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The 32 random bits of element `index` of a stream: word index % 4 of quad index / 4. Four
// neighbouring elements share one Philox evaluation, so a kernel that handles 4 aligned
// elements per thread pays one call (philox_random_quad).
SFMOE_HD uint32_t philox_random_bits(uint64_t seed, uint64_t offset, uint64_t index) {
  return philox_random_quad(seed, offset, index >> 2).v[index & 3];
}

}  // namespace numerics
}  // namespace sfmoe

// The 16-point random Hadamard transform applied to NVFP4 columnwise (wgrad) operands: spreads
// outliers across a 16-element block before the block scale is taken. y = H16 * diag(s) * x / 4
// with the Sylvester Hadamard matrix H16[i][j] = (-1)^popcount(i & j) and a fixed sign vector s.
// H16 / 4 and diag(s) are orthonormal, so the transform keeps norms; its inverse is
// diag(s) * H16 / 4 (the sign flip after, not before, the butterfly).
// The butterfly order below is part of the definition: FP32 additions in this exact order on
// host and device give the same bits.
#pragma once

#include "sfmoe/numerics/bits.h"

namespace sfmoe {
namespace numerics {

constexpr int kHadamardSize = 16;

// The sign vector of DESIGN.md section 4, one entry per element of the block.
SFMOE_HD float hadamard_sign(int i) {
  // Bit i set = -1:  [1,1,1,-1, 1,-1,-1,-1, -1,-1,-1,1, -1,1,-1,-1]
  constexpr uint32_t kNegativeMask = 0xD7E8u;
  return ((kNegativeMask >> i) & 1u) ? -1.0f : 1.0f;
}

// The four butterfly stages of H16 (unscaled), in the order that defines the bits.
SFMOE_HD void hadamard16_butterfly(float v[kHadamardSize]) {
  SFMOE_UNROLL
  for (int half = 1; half < kHadamardSize; half <<= 1) {
    SFMOE_UNROLL
    for (int i = 0; i < kHadamardSize; ++i) {
      if (i & half) continue;
      const float a = v[i], b = v[i + half];
      v[i] = add_rn(a, b);
      v[i + half] = add_rn(a, -b);
    }
  }
}

SFMOE_HD void hadamard16_transform(float v[kHadamardSize]) {
  SFMOE_UNROLL
  for (int i = 0; i < kHadamardSize; ++i) v[i] = mul_rn(v[i], hadamard_sign(i));
  hadamard16_butterfly(v);
  SFMOE_UNROLL
  for (int i = 0; i < kHadamardSize; ++i) v[i] = mul_rn(v[i], 0.25f);
}

// The inverse, diag(s) * H16 / 4: the same butterfly, the scaling, then the signs.
SFMOE_HD void hadamard16_inverse(float v[kHadamardSize]) {
  hadamard16_butterfly(v);
  SFMOE_UNROLL
  for (int i = 0; i < kHadamardSize; ++i) v[i] = mul_rn(mul_rn(v[i], 0.25f), hadamard_sign(i));
}

}  // namespace numerics
}  // namespace sfmoe

// The amax (numerics/scaling.h's rule: the largest magnitude, NaN propagating) of FP32, BF16 or
// FP16 values taken on their raw bits: these formats order their magnitudes like unsigned
// integers (NaNs above Inf), so magnitudes are compared as integers, two 16-bit ones per word,
// and decoded once at the end.
#pragma once

#include <stdint.h>

#include "sfmoe/numerics/scaling.h"
#include "sfmoe/sfmoe.h"
#include "src/common/element_codec.h"

namespace sfmoe {
namespace cuda {

__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Packed |bits| maximum of two 16-bit codes per word.
__device__ __forceinline__ uint32_t abs_max_u16x2(uint32_t running, uint32_t word) {
  return max_u16x2(running, word & 0x7FFF7FFFu);
}

// The amax of a 16-bit magnitude (BF16 or FP16 code without its sign), as the FP32 amax bits of
// the decoded value. With `dtype` a compile-time constant the test folds away.
__device__ __forceinline__ uint32_t half_magnitude_amax_bits(sfmoe_dtype dtype,
                                                             uint32_t magnitude) {
  if (dtype == SFMOE_DTYPE_BF16) return magnitude << 16;
  return numerics::amax_bits(decode_element(dtype, magnitude));
}

// A running amax over raw words of one dtype (chosen at run time).
struct RawAmax {
  sfmoe_dtype dtype;
  uint32_t running = 0;  // FP32: magnitude bits; 16-bit types: two magnitudes, packed

  __device__ explicit RawAmax(sfmoe_dtype d) : dtype(d) {}

  // Four words of raw elements (a 16-byte vector).
  __device__ __forceinline__ void add(uint4 v) {
    if (dtype == SFMOE_DTYPE_FP32) {
      constexpr uint32_t kMask = 0x7FFFFFFFu;
      running = max(running, max(max(v.x & kMask, v.y & kMask), max(v.z & kMask, v.w & kMask)));
    } else {
      running =
          abs_max_u16x2(abs_max_u16x2(abs_max_u16x2(abs_max_u16x2(running, v.x), v.y), v.z), v.w);
    }
  }

  // One element's code (the low 16 bits for the 16-bit types).
  __device__ __forceinline__ void add_code(uint32_t code) {
    if (dtype == SFMOE_DTYPE_FP32) {
      running = max(running, code & 0x7FFFFFFFu);
    } else {
      running = abs_max_u16x2(running, code & 0xFFFFu);
    }
  }

  // The amax as FP32 bits (amax_bits of the decoded value).
  __device__ __forceinline__ uint32_t bits() const {
    if (dtype == SFMOE_DTYPE_FP32) return running;
    return half_magnitude_amax_bits(dtype, max(running >> 16, running & 0xFFFFu));
  }
};

}  // namespace cuda
}  // namespace sfmoe

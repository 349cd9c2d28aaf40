// Row elements of FP32, BF16 or FP16 read as FP32 and written from FP32 on the device, by eights
// (one 16-byte vector for the 16-bit types, two for FP32) or one at a time, through the numerics
// headers' conversions: the bits the CPU reference writes.
#pragma once

#include <stdint.h>

#include "sfmoe/numerics/float_formats.h"
#include "sfmoe/sfmoe.h"

namespace sfmoe {
namespace cuda {

// Elements as FP32 and back, in the numerics headers' conversions (the CPU's bits).
__device__ __forceinline__ float load_element(const void* p, sfmoe_dtype dtype, int64_t i) {
  if (dtype == SFMOE_DTYPE_FP32) return static_cast<const float*>(p)[i];
  const uint16_t code = static_cast<const uint16_t*>(p)[i];
  return dtype == SFMOE_DTYPE_BF16 ? numerics::bf16_to_f32(code) : numerics::fp16_to_f32(code);
}
__device__ __forceinline__ void store_element(void* p, sfmoe_dtype dtype, int64_t i, float v) {
  if (dtype == SFMOE_DTYPE_FP32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] =
        dtype == SFMOE_DTYPE_BF16 ? numerics::f32_to_bf16(v) : numerics::f32_to_fp16(v);
  }
}

// kVec consecutive elements (16-byte aligned when kVec > 1) as FP32.
template <int kVec>
__device__ __forceinline__ void load_vector(const void* p, sfmoe_dtype dtype, int64_t first,
                                            float (&v)[kVec]) {
  static_assert(kVec == 8 || kVec == 1, "eights or ones");
  if constexpr (kVec == 8) {
    if (dtype == SFMOE_DTYPE_FP32) {
      const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + first);
      const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + first + 4);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
      v[7] = b.w;
      return;
    }
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + first);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const uint16_t code = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
      v[i] = dtype == SFMOE_DTYPE_BF16 ? numerics::bf16_to_f32(code) : numerics::fp16_to_f32(code);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = load_element(p, dtype, first + i);
  }
}

template <int kVec>
__device__ __forceinline__ void store_vector(void* p, sfmoe_dtype dtype, int64_t first,
                                             const float (&v)[kVec]) {
  static_assert(kVec == 8 || kVec == 1, "eights or ones");
  if constexpr (kVec == 8) {
    if (dtype == SFMOE_DTYPE_FP32) {
      *reinterpret_cast<float4*>(static_cast<float*>(p) + first) =
          make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(static_cast<float*>(p) + first + 4) =
          make_float4(v[4], v[5], v[6], v[7]);
      return;
    }
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool bf16 = dtype == SFMOE_DTYPE_BF16;
      const uint32_t lo = bf16 ? numerics::f32_to_bf16(v[2 * i]) : numerics::f32_to_fp16(v[2 * i]);
      const uint32_t hi =
          bf16 ? numerics::f32_to_bf16(v[2 * i + 1]) : numerics::f32_to_fp16(v[2 * i + 1]);
      words[i] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p) + first) =
        make_uint4(words[0], words[1], words[2], words[3]);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) store_element(p, dtype, first + i, v[i]);
  }
}

}  // namespace cuda
}  // namespace sfmoe

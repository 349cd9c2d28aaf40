// Row elements of FP32, BF16 or FP16 read as FP32 and written from FP32 on the device, by eights
// (one 16-byte vector for the 16-bit types, two for FP32) or one at a time, through the numerics
// headers' conversions: the bits the CPU reference writes.
#pragma once

#include <stdint.h>

#include "sfmoe/numerics/float_formats.h"
#include "sfmoe/sfmoe.h"

namespace sfmoe {
namespace cuda {

// An element written from FP32 (the CPU's bits).
__device__ __forceinline__ void store_element(void* p, sfmoe_dtype dtype, int64_t i, float v) {
  if (dtype == SFMOE_DTYPE_FP32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] =
        dtype == SFMOE_DTYPE_BF16 ? numerics::f32_to_bf16(v) : numerics::f32_to_fp16(v);
  }
}

// kVec consecutive elements as they lie in memory (32 bytes at most), so that a kernel can issue
// the loads of its next step before it decodes and computes the current one.
template <int kVec>
struct RawVector {
  static_assert(kVec == 8 || kVec == 1, "eights or ones");
  uint4 words[2];
};

// Loads kVec elements (16-byte aligned when kVec > 1): one 16-byte vector for the 16-bit types,
// two for FP32.
template <int kVec>
__device__ __forceinline__ RawVector<kVec> load_raw_vector(const void* p, sfmoe_dtype dtype,
                                                           int64_t first) {
  RawVector<kVec> r;
  if constexpr (kVec == 8) {
    if (dtype == SFMOE_DTYPE_FP32) {
      const uint4* v = reinterpret_cast<const uint4*>(static_cast<const float*>(p) + first);
      r.words[0] = v[0];
      r.words[1] = v[1];
    } else {
      r.words[0] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + first);
    }
  } else {
    r.words[0].x = dtype == SFMOE_DTYPE_FP32 ? static_cast<const uint32_t*>(p)[first]
                                             : static_cast<const uint16_t*>(p)[first];
  }
  return r;
}

// The loaded elements as FP32, through the numerics headers' conversions.
template <int kVec>
__device__ __forceinline__ void decode_raw_vector(const RawVector<kVec>& r, sfmoe_dtype dtype,
                                                  float (&v)[kVec]) {
  const uint32_t words[8] = {r.words[0].x, r.words[0].y, r.words[0].z, r.words[0].w,
                             r.words[1].x, r.words[1].y, r.words[1].z, r.words[1].w};
  if (dtype == SFMOE_DTYPE_FP32) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = numerics::bits_to_f32(words[i]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const uint16_t code = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
    v[i] = dtype == SFMOE_DTYPE_BF16 ? numerics::bf16_to_f32(code) : numerics::fp16_to_f32(code);
  }
}

// kVec consecutive elements (16-byte aligned when kVec > 1) as FP32.
template <int kVec>
__device__ __forceinline__ void load_vector(const void* p, sfmoe_dtype dtype, int64_t first,
                                            float (&v)[kVec]) {
  decode_raw_vector<kVec>(load_raw_vector<kVec>(p, dtype, first), dtype, v);
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

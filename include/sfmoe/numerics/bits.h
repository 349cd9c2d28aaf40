// Bit-level helpers shared by every numerics header. Everything here is __host__ __device__ so the
// CPU reference and the CUDA kernels run the very same code; arithmetic that must round exactly
// once goes through mul_rn/div_rn so no compiler can contract it into an FMA or approximate it.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SFMOE_HD __host__ __device__ __forceinline__
#else
#define SFMOE_HD inline
#endif
// Loop unrolling in shared host/device code: a device-pass pragma only (host compilers would
// warn about it).
#if defined(__CUDA_ARCH__)
#define SFMOE_UNROLL _Pragma("unroll")
#else
#define SFMOE_UNROLL
#endif

namespace sfmoe {
namespace numerics {

constexpr uint32_t kF32SignMask = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32InfBits = 0x7F800000u;
constexpr uint32_t kF32MantissaMask = 0x007FFFFFu;
constexpr int kF32MantissaBits = 23;
constexpr uint32_t kF32MaxBits = 0x7F7FFFFFu;  // FLT_MAX
constexpr uint32_t kF32CanonicalNanBits = 0x7FFFFFFFu;

// Adding 1.5 * 2^23 to |v| < 2^22 leaves a unit spacing, so the sum rounds v to the nearest
// integer (ties to even) once, and the sum's low mantissa bits hold that integer.
constexpr float kRoundingShift = 12582912.0f;

SFMOE_HD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

SFMOE_HD float bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

SFMOE_HD bool f32_is_nan(float f) { return (f32_to_bits(f) & kF32AbsMask) > kF32InfBits; }
SFMOE_HD bool f32_is_inf(float f) { return (f32_to_bits(f) & kF32AbsMask) == kF32InfBits; }
SFMOE_HD float f32_max() { return bits_to_f32(kF32MaxBits); }
SFMOE_HD float f32_abs(float f) { return bits_to_f32(f32_to_bits(f) & kF32AbsMask); }
SFMOE_HD uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }
// Byte k of the result is byte (selector >> 4k) & 7 of the eight bytes {b:a} (a is bytes 0-3):
// CUDA's __byte_perm (one PRMT) without its sign-replicate mode, and the same on the host.
SFMOE_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, selector);
#else
  const uint64_t bytes = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t out = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t index = (selector >> (4 * k)) & 7u;
    out |= static_cast<uint32_t>((bytes >> (8 * index)) & 0xFFu) << (8 * k);
  }
  return out;
#endif
}
// The next float above f, for f in [+0, FLT_MAX] (one more in the bits).
SFMOE_HD float f32_next_up_nonnegative(float f) { return bits_to_f32(f32_to_bits(f) + 1u); }

// NVIDIA GPUs return the canonical NaN 0x7FFFFFFF from FP32 arithmetic, whatever the operands'
// NaN payloads or signs; x86 propagates a payload. The host side adopts the GPU's rule so NaN
// results have the same bits on both.
SFMOE_HD float canonical_nan_if_nan(float f) {
  return f32_is_nan(f) ? bits_to_f32(kF32CanonicalNanBits) : f;
}

// Round-to-nearest-even FP32 product, quotient and sum, exactly once, on both compilers. The
// host side is built with -ffp-contract=off; on the device the intrinsics forbid contraction and
// approximate division.
SFMOE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return canonical_nan_if_nan(a * b);
#endif
}

SFMOE_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return canonical_nan_if_nan(a / b);
#endif
}

SFMOE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return canonical_nan_if_nan(a + b);
#endif
}

// 1 / a rounded once (the same value as div_rn(1, a)).
SFMOE_HD float rcp_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(a);
#else
  return canonical_nan_if_nan(1.0f / a);
#endif
}

// a * b + c rounded once (a fused multiply-add): __fmaf_rn on the device, C's fmaf (correctly
// rounded in glibc, in hardware or software) on the host.
SFMOE_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return canonical_nan_if_nan(fmaf(a, b, c));
#endif
}

// IEEE-754 minNum (C's fminf): a NaN operand loses to a number. The scale rules rely on this to
// turn a NaN quotient into FLT_MAX, as TransformerEngine's fminf does.
SFMOE_HD float min_num(float a, float b) {
  if (f32_is_nan(a)) return b;
  if (f32_is_nan(b)) return a;
  return a < b ? a : b;
}

SFMOE_HD float max_num(float a, float b) {
  if (f32_is_nan(a)) return b;
  if (f32_is_nan(b)) return a;
  return a > b ? a : b;
}

}  // namespace numerics
}  // namespace sfmoe

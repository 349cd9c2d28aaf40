// The narrow floating-point formats: BF16, FP16, FP8 E4M3 / E5M2 and FP4 E2M1.
//
// One generic encoder (FP32 -> narrow code, round to nearest even) and one generic decoder serve
// every format; a format is a handful of constants. Rules, chosen to match the conversions the
// NVIDIA hardware performs (cvt.rn.satfinite.* for FP8, cvt.rn.{bf16,f16}.f32 for 16-bit), so a
// kernel may use the instruction wherever a device test proves it equal to this definition:
//   - FP8 and FP4 saturate: any finite or infinite magnitude beyond the largest finite value
//     becomes +-max. NaN becomes the format's canonical NaN (E4M3 0x7F, E5M2 0x7F); E2M1 has no
//     NaN, so NaN becomes +6 (CUDA's E2M1 conversion does the same).
//   - BF16 and FP16 follow IEEE: overflow gives +-Inf, NaN gives the canonical 0x7FFF.
//   - The sign of zero is kept (-0.0 encodes to the sign bit alone).
// Decoding is exact: every narrow value is an FP32 value.
#pragma once

#include "sfmoe/numerics/bits.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

// On sm_89+ devices the FP8, BF16 and FP16 encoders use the hardware conversion instructions
// (cvt.rn.satfinite.e4m3x2/e5m2x2.f32, cvt.rn.bf16.f32, cvt.rn.f16.f32). They were checked to give
// the software definition's bits on every input of the numerics suite, NaNs included, and the
// device suite keeps checking it (it evaluates these functions on the device against the host).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define SFMOE_HARDWARE_CONVERSIONS 1
#endif

namespace sfmoe {
namespace numerics {

// A format is a traits struct of compile-time constants (usable in host and device code alike):
//   kExponentBits, kMantissaBits, kExponentBias;
//   kMaxFinite: code of the largest finite value, sign bit clear;
//   kSaturate: overflow gives +-max (true) or +-Inf (false, needs kHasInf);
//   kHasInf: all-ones exponent with zero mantissa is Inf;
//   kHasNan, kNanCode: the canonical NaN the encoder writes;
//   kNanOnlyAllOnes: only the all-ones magnitude is NaN (E4M3), else all-ones exponent with a
//   non-zero mantissa (IEEE style).
struct FormatE4M3 {
  static constexpr int kExponentBits = 4, kMantissaBits = 3, kExponentBias = 7;
  static constexpr uint32_t kMaxFinite = 0x7E, kNanCode = 0x7F;
  static constexpr bool kSaturate = true, kHasInf = false, kHasNan = true, kNanOnlyAllOnes = true;
};
struct FormatE5M2 {
  static constexpr int kExponentBits = 5, kMantissaBits = 2, kExponentBias = 15;
  static constexpr uint32_t kMaxFinite = 0x7B, kNanCode = 0x7F;
  static constexpr bool kSaturate = true, kHasInf = true, kHasNan = true, kNanOnlyAllOnes = false;
};
struct FormatE2M1 {
  static constexpr int kExponentBits = 2, kMantissaBits = 1, kExponentBias = 1;
  static constexpr uint32_t kMaxFinite = 0x7, kNanCode = 0x7;  // no NaN: NaN encodes as +6
  static constexpr bool kSaturate = true, kHasInf = false, kHasNan = false, kNanOnlyAllOnes = false;
};
struct FormatFP16 {
  static constexpr int kExponentBits = 5, kMantissaBits = 10, kExponentBias = 15;
  static constexpr uint32_t kMaxFinite = 0x7BFF, kNanCode = 0x7FFF;
  static constexpr bool kSaturate = false, kHasInf = true, kHasNan = true, kNanOnlyAllOnes = false;
};

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
constexpr float kE2M1Max = 6.0f;

// Encode |x| given as FP32 magnitude bits (no sign, not NaN/Inf) into the format's magnitude
// code, round to nearest even, before the overflow rule is applied. May return a value above
// kMaxFinite, which the caller resolves.
template <class Format>
SFMOE_HD uint32_t narrow_magnitude_rne(uint32_t abs_bits) {
  const int min_normal_exponent = 1 - Format::kExponentBias;
  int exponent = static_cast<int>(abs_bits >> kF32MantissaBits);
  uint32_t significand = abs_bits & kF32MantissaMask;
  if (exponent == 0) {
    exponent = -126;  // FP32 subnormal: no implicit bit
  } else {
    significand |= 1u << kF32MantissaBits;
    exponent -= 127;
  }
  // Bits of the 24-bit significand dropped to fit the target mantissa (more when the value is
  // subnormal in the target format).
  int shift = kF32MantissaBits - Format::kMantissaBits;
  if (exponent < min_normal_exponent) shift += min_normal_exponent - exponent;
  if (shift > 25) return 0;  // below half the smallest subnormal: rounds to zero
  const uint32_t kept = significand >> shift;
  const uint32_t dropped = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rounded = kept + ((dropped > half || (dropped == half && (kept & 1u))) ? 1u : 0u);
  if (exponent < min_normal_exponent) return rounded;  // subnormal; a carry lands on min normal
  // Normal: rounded holds the implicit bit, so adding it to the biased-exponent field minus one
  // both stores the mantissa and carries a mantissa overflow into the exponent.
  const int64_t code =
      (static_cast<int64_t>(exponent + Format::kExponentBias - 1) << Format::kMantissaBits) +
      rounded;
  return code > 0xFFFFFF ? 0xFFFFFFu : static_cast<uint32_t>(code);
}

template <class Format>
SFMOE_HD uint32_t encode_narrow(float x) {
  constexpr int kMagnitudeBits = Format::kExponentBits + Format::kMantissaBits;
  constexpr uint32_t kInfCode = ((1u << Format::kExponentBits) - 1u) << Format::kMantissaBits;
  const uint32_t bits = f32_to_bits(x);
  const uint32_t sign = (bits & kF32SignMask) ? (1u << kMagnitudeBits) : 0u;
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > kF32InfBits) return Format::kNanCode;
  if (abs_bits == kF32InfBits) return sign | (Format::kSaturate ? Format::kMaxFinite : kInfCode);
  const uint32_t magnitude = narrow_magnitude_rne<Format>(abs_bits);
  if (magnitude > Format::kMaxFinite) {
    return sign | (Format::kSaturate ? Format::kMaxFinite : kInfCode);
  }
  return sign | magnitude;
}

template <class Format>
SFMOE_HD float decode_narrow(uint32_t code) {
  constexpr int kMagnitudeBits = Format::kExponentBits + Format::kMantissaBits;
  constexpr uint32_t kAllOnes = (1u << Format::kExponentBits) - 1u;
  constexpr uint32_t kMantissaMask = (1u << Format::kMantissaBits) - 1u;
  const uint32_t sign_f32 = ((code >> kMagnitudeBits) & 1u) << 31;
  const uint32_t magnitude = code & ((1u << kMagnitudeBits) - 1u);
  const uint32_t exponent_field = magnitude >> Format::kMantissaBits;
  const uint32_t mantissa = magnitude & kMantissaMask;
  if (Format::kHasNan) {
    const bool is_nan = Format::kNanOnlyAllOnes ? magnitude == ((1u << kMagnitudeBits) - 1u)
                                                : (exponent_field == kAllOnes && mantissa != 0);
    if (is_nan) return bits_to_f32(sign_f32 | kF32CanonicalNanBits);
  }
  if (Format::kHasInf && exponent_field == kAllOnes && mantissa == 0) {
    return bits_to_f32(sign_f32 | kF32InfBits);
  }
  if (exponent_field == 0) {
    // Subnormal: mantissa * 2^(1 - bias - mantissa_bits); both factors and the product exact.
    constexpr uint32_t kScaleBits =
        static_cast<uint32_t>(127 + 1 - Format::kExponentBias - Format::kMantissaBits)
        << kF32MantissaBits;
    const float value = mul_rn(static_cast<float>(mantissa), bits_to_f32(kScaleBits));
    return bits_to_f32(sign_f32 | f32_to_bits(value));
  }
  const uint32_t f32_exponent = exponent_field - Format::kExponentBias + 127;
  return bits_to_f32(sign_f32 | (f32_exponent << kF32MantissaBits) |
                     (mantissa << (kF32MantissaBits - Format::kMantissaBits)));
}

// --- FP8 -------------------------------------------------------------------------------------
SFMOE_HD uint8_t f32_to_e4m3(float x) {
#if defined(SFMOE_HARDWARE_CONVERSIONS)
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
#else
  return static_cast<uint8_t>(encode_narrow<FormatE4M3>(x));
#endif
}
SFMOE_HD uint8_t f32_to_e5m2(float x) {
#if defined(SFMOE_HARDWARE_CONVERSIONS)
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
#else
  return static_cast<uint8_t>(encode_narrow<FormatE5M2>(x));
#endif
}
// Two codes at once, `lo` in the low byte: the same function as two single conversions, in one
// cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 on sm_89+ (the device suite checks the pairing).
SFMOE_HD uint16_t f32x2_to_e4m3x2(float lo, float hi) {
#if defined(SFMOE_HARDWARE_CONVERSIONS)
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
#else
  return static_cast<uint16_t>(f32_to_e4m3(lo) | (f32_to_e4m3(hi) << 8));
#endif
}
SFMOE_HD uint16_t f32x2_to_e5m2x2(float lo, float hi) {
#if defined(SFMOE_HARDWARE_CONVERSIONS)
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E5M2);
#else
  return static_cast<uint16_t>(f32_to_e5m2(lo) | (f32_to_e5m2(hi) << 8));
#endif
}
// E4M3 without branches (the NVFP4 encoders decode a block scale per 16 values): the magnitude's
// fields shifted up by 20 bits are an FP32 with the value times 2^-120 (exponent bias 127 instead
// of 7; E4M3's subnormals land on FP32 subnormals), so one exact multiplication by 2^120 gives the
// value. 0x7F / 0xFF are NaN. The same function as decode_narrow<FormatE4M3> (tests: every code).
SFMOE_HD float e4m3_to_f32(uint8_t code) {
  const uint32_t magnitude = code & 0x7Fu, sign = (code & 0x80u) << 24;
  const float value = mul_rn(bits_to_f32(magnitude << 20), 0x1p120f);
  return bits_to_f32(sign | (magnitude == 0x7Fu ? kF32CanonicalNanBits : f32_to_bits(value)));
}
SFMOE_HD float e5m2_to_f32(uint8_t code) { return decode_narrow<FormatE5M2>(code); }

// --- FP4 E2M1 (a 4-bit code in the low nibble; two per byte, element 2i in the low nibble) -----
// E2M1 has eight magnitudes (0, .5, 1, 1.5, 2, 3, 4, 6), round-to-nearest-even onto them. The
// step is 0.5 below 2, 1 below 4 and 2 above, so the code of a magnitude m is rint(2m) below 2,
// rint(m) + 2 below 4 and rint(m / 2) + 4 above (at most 7). Each of the three is also an upper
// bound of the code where it does not apply (2m >= m + 2 from 2 up, m + 2 >= m / 2 + 4 from 4 up,
// and rint is monotonic), so the code is the least of them and 7. Each rint is one floating-point
// operation, the addition of 1.5 * 2^23 (plus the offset 0, 2 or 4: even, so ties still go to
// even) whose result holds the integer in its low bits; the results are positive floats, whose
// bits order as integers, so two integer minima pick the code. The three roundings run on the FMA
// pipe, which the rest of the NVFP4 encoders leave idle; the rest is four integer operations.
constexpr uint32_t kE2M1CandidateBias = 0x4B400000u;  // the bits of 1.5 * 2^23

// The least candidate for |x|: the FP32 bits of 1.5 * 2^23 + code(|x|), i.e. the code plus
// kE2M1CandidateBias.
SFMOE_HD uint32_t e2m1_magnitude_candidate(float x) {
  const float m = fabsf(x);
  const uint32_t below_two = f32_to_bits(fma_rn(m, 2.0f, kRoundingShift));
  const uint32_t below_four = f32_to_bits(add_rn(m, kRoundingShift + 2.0f));
  const uint32_t above = f32_to_bits(fma_rn(m, 0.5f, kRoundingShift + 4.0f));
  return min_u32(min_u32(below_two, below_four), min_u32(above, kE2M1CandidateBias + 7u));
}
// The code of x whose NaNs are canonical (positive), as every product and sum of the arithmetic
// helpers is: a NaN's bits then exceed every candidate, so it takes code 7, which is E2M1's NaN
// code (E2M1 has no NaN; NaN becomes +6, as CUDA's E2M1 conversion does), with no test of its
// own. f32_to_e2m1 below takes any float. Both equal encode_narrow<FormatE2M1> (the tests check
// every float).
SFMOE_HD uint8_t f32_to_e2m1_canonical_nan(float x) {
  static_assert(FormatE2M1::kNanCode == 0x7, "a NaN takes the saturated code");
  // The low three bits of the candidate are the magnitude's code; bit 3 of the shifted input, its
  // sign.
  return static_cast<uint8_t>((e2m1_magnitude_candidate(x) & 0x7u) |
                              ((f32_to_bits(x) >> 28) & ~0x7u));
}
// Eight values (canonical NaNs) as eight E2M1 codes in one word, element k in nibble k. The
// magnitudes are summed as candidates times 16^k, their biases cancelled by one constant (the
// sums wrap modulo 2^32 and every code fits its nibble), which the device does with multiply-adds
// on the FMA pipe. The signs: byte j of the word holds elements 2j (low nibble) and 2j + 1, so the
// top bytes of the odd elements, gathered into bytes 0-3, already have each sign at bit 7 of its
// byte, and those of the even elements need it moved down by 4 (two byte gathers of three
// permutes each, then a shift and two masks, instead of a shift and a merge per value).
SFMOE_HD uint32_t pack_e2m1x8_canonical_nan(const float (&x)[8]) {
  uint32_t magnitudes = 0u - kE2M1CandidateBias * 0x11111111u;  // minus the eight biases
  SFMOE_UNROLL
  for (int k = 0; k < 8; ++k) magnitudes += e2m1_magnitude_candidate(x[k]) * (1u << (4 * k));
  uint32_t b[8];
  SFMOE_UNROLL
  for (int k = 0; k < 8; ++k) b[k] = f32_to_bits(x[k]);
  // Top bytes of elements (0, 2 | 4, 6) and (1, 3 | 5, 7) into bytes 0-3 (selector 3: a's byte 3;
  // 7: b's byte 3; 0x7610: bytes 0-1 of the first, 2-3 of the second).
  const uint32_t even =
      byte_perm(byte_perm(b[0], b[2], 0x0073u), byte_perm(b[4], b[6], 0x7300u), 0x7610u);
  const uint32_t odd =
      byte_perm(byte_perm(b[1], b[3], 0x0073u), byte_perm(b[5], b[7], 0x7300u), 0x7610u);
  return magnitudes | (odd & 0x80808080u) | ((even >> 4) & 0x08080808u);
}
SFMOE_HD uint8_t f32_to_e2m1(float x) {
  return f32_to_e2m1_canonical_nan(f32_is_nan(x) ? bits_to_f32(kF32CanonicalNanBits) : x);
}
SFMOE_HD float e2m1_to_f32(uint8_t code) { return decode_narrow<FormatE2M1>(code & 0xFu); }

// --- FP16 -------------------------------------------------------------------------------------
SFMOE_HD uint16_t f32_to_fp16(float x) {
#if defined(SFMOE_HARDWARE_CONVERSIONS)
  return __half_as_ushort(__float2half_rn(x));
#else
  return static_cast<uint16_t>(encode_narrow<FormatFP16>(x));
#endif
}
SFMOE_HD float fp16_to_f32(uint16_t code) { return decode_narrow<FormatFP16>(code); }

// --- BF16: the top half of an FP32; rounding is one integer add ---------------------------------
SFMOE_HD uint16_t f32_to_bf16(float x) {
#if defined(SFMOE_HARDWARE_CONVERSIONS)
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#endif
  const uint32_t bits = f32_to_bits(x);
  if ((bits & kF32AbsMask) > kF32InfBits) return 0x7FFF;
  const uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}
SFMOE_HD float bf16_to_f32(uint16_t code) { return bits_to_f32(static_cast<uint32_t>(code) << 16); }

// --- Stochastic rounding to E2M1 ---------------------------------------------------------------
// x lies between two neighbouring E2M1 magnitudes lo <= |x| < hi. With frac = (|x| - lo) / (hi -
// lo) (exact in FP32: the difference of two values within a binade, divided by a power of two), the
// magnitude rounds up to hi exactly when random_bits < floor(frac * 2^32): the probability is frac
// to within 2^-32, so the rounding is unbiased. Saturation, NaN and the sign follow encode_narrow.
SFMOE_HD uint8_t f32_to_e2m1_stochastic(float x, uint32_t random_bits) {
  const uint32_t bits = f32_to_bits(x);
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits >= kF32InfBits) return f32_to_e2m1(x);  // NaN, +-Inf: the deterministic rule
  const float magnitude = bits_to_f32(abs_bits);
  const uint8_t sign = (bits & kF32SignMask) ? 0x8 : 0x0;
  if (!(magnitude < kE2M1Max)) return sign | 0x7;
  // E2M1 magnitudes 0, .5, 1, 1.5 | 2, 3 | 4, 6: step 0.5 below 2, 1 below 4, 2 below 6.
  const float step = magnitude < 2.0f ? 0.5f : (magnitude < 4.0f ? 1.0f : 2.0f);
  const float steps = div_rn(magnitude, step);             // exact: step is a power of two
  const uint32_t lo_steps = static_cast<uint32_t>(steps);  // truncation = floor (positive)
  const float lo = mul_rn(static_cast<float>(lo_steps), step);
  const float frac = div_rn(add_rn(magnitude, -lo), step);  // exact (Sterbenz / power of two)
  const uint32_t threshold = static_cast<uint32_t>(mul_rn(frac, 4294967296.0f));
  const float rounded = (random_bits < threshold) ? add_rn(lo, step) : lo;
  return sign | f32_to_e2m1(rounded);  // rounded is an exact E2M1 value
}

}  // namespace numerics
}  // namespace sfmoe

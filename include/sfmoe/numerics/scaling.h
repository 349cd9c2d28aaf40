// Scale rules of every quantization recipe (../docs/numerics.md gives the reasoning). They follow
// TransformerEngine so that scales, and therefore results and checkpoints, carry over; the one
// documented difference is the MXFP8 element multiplier for E8M0 code 0 (see mx_multiplier).
#pragma once

#include "sfmoe/numerics/bits.h"
#include "sfmoe/numerics/float_formats.h"

namespace sfmoe {
namespace numerics {

// --- amax ----------------------------------------------------------------------------------------
// The running max of |value| with NaN propagation: a NaN anywhere makes the amax NaN, so a NaN in
// the data cannot hide behind the scale (IEEE max would drop it). On non-negative FP32 bit
// patterns integer order is value order, and every NaN's magnitude bits exceed Inf's, so one
// unsigned max does both; kernels use the same rule through atomicMax on the bits.
SFMOE_HD uint32_t amax_bits(float value) { return f32_to_bits(value) & kF32AbsMask; }
SFMOE_HD float amax_accumulate(float running_amax, float value) {
  const uint32_t a = amax_bits(running_amax), b = amax_bits(value);
  return bits_to_f32(a > b ? a : b);
}

// --- E8M0: a bare biased power-of-two exponent (MX block scales) -------------------------------
constexpr uint8_t kE8M0Nan = 0xFF;

// Round up to a power of two and saturate (the semantics of cvt.rp.satfinite.ue8m0x2.f32):
// NaN -> 255, Inf -> 254, 0 -> 0; otherwise the FP32 biased exponent, plus one when the mantissa
// is non-zero, except at exponent 254 (saturation) and for subnormals whose mantissa is at most
// 0x400000 (2^-127 already covers them). The sign is ignored: scales come from magnitudes.
// Written as selects, without branches (kernels compute one per 32 values): NaN keeps exponent
// 255 because nothing at or above 254 rounds up, and Inf (exponent 255, no mantissa) is the one
// case replaced.
SFMOE_HD uint8_t f32_to_e8m0(float x) {
  const uint32_t abs_bits = f32_to_bits(x) & kF32AbsMask;
  const uint32_t exponent = abs_bits >> kF32MantissaBits;
  const uint32_t mantissa = abs_bits & kF32MantissaMask;
  const uint32_t round_up =
      (mantissa > (exponent == 0 ? 0x400000u : 0u) && exponent < 0xFE) ? 1u : 0u;
  return static_cast<uint8_t>(abs_bits == kF32InfBits ? 0xFEu : exponent + round_up);
}

// 2^(e - 127); code 0 is 2^-127 (an FP32 subnormal), code 255 NaN.
SFMOE_HD float e8m0_to_f32(uint8_t e) {
  if (e == kE8M0Nan) return bits_to_f32(kF32CanonicalNanBits);
  if (e == 0) return bits_to_f32(0x00400000u);
  return bits_to_f32(static_cast<uint32_t>(e) << kF32MantissaBits);
}

// --- FP8 per-tensor (current scaling) and FP8 blockwise (1x128, 128x128) -----------------------
// scale = fp8_max / amax (FP32, RN). amax 0, Inf or NaN (or a negative value, which no absolute
// maximum can be) -> 1; an infinite quotient -> FLT_MAX. power_of_two clears the mantissa, i.e.
// rounds the scale down to a power of two so that scaling is exact.
SFMOE_HD float fp8_scale_from_amax(float amax, float fp8_max, bool power_of_two) {
  float scale = 1.0f;
  if (amax > 0.0f && !f32_is_inf(amax)) {  // false for NaN too
    scale = div_rn(fp8_max, amax);
    if (f32_is_inf(scale)) scale = f32_max();
  }
  if (power_of_two) scale = bits_to_f32(f32_to_bits(scale) & 0xFF800000u);
  return scale;
}

// What is stored next to the data: the decode factor.
SFMOE_HD float scale_inverse(float scale) { return div_rn(1.0f, scale); }

// --- MXFP8: blocks of 32, an E8M0 scale each -----------------------------------------------------
// e8m0(block_amax * (1 / fp8_max)). Kernels pass the reciprocal computed once
// (mx_scale_from_amax_and_inverse_max); both forms are the same function.
SFMOE_HD uint8_t mx_scale_from_amax_and_inverse_max(float block_amax, float inverse_fp8_max) {
  return f32_to_e8m0(mul_rn(block_amax, inverse_fp8_max));
}
SFMOE_HD uint8_t mx_scale_from_amax(float block_amax, float fp8_max) {
  return mx_scale_from_amax_and_inverse_max(block_amax, div_rn(1.0f, fp8_max));
}

// Element multiplier applied before the FP8 cast: the FP32 with bits (254 - e) << 23, i.e.
// 2^(127 - e), which is 0 for e = 254 (2^-127 is below FP32's normal range and the bit pattern
// formula gives +0) and NaN for e = 255. Unlike TransformerEngine (which uses 1 for e = 0), code 0
// multiplies by 2^127 here, so blocks of tiny values keep their resolution instead of flushing.
SFMOE_HD float mx_multiplier(uint8_t e) {
  if (e == kE8M0Nan) return bits_to_f32(kF32CanonicalNanBits);
  return bits_to_f32(static_cast<uint32_t>(254 - e) << kF32MantissaBits);
}

// --- NVFP4: E2M1 data, E4M3 scales per 16 elements, an FP32 global encode scale ----------------
// S_enc = min(448 * 6 / global_amax, FLT_MAX) with IEEE minNum (a NaN quotient gives FLT_MAX),
// and 1 when global_amax is 0 or S_enc is 0 (global_amax Inf).
SFMOE_HD float nvfp4_global_encode_scale(float global_amax) {
  const float encode = min_num(div_rn(kE4M3Max * kE2M1Max, global_amax), f32_max());
  if (global_amax == 0.0f || encode == 0.0f) return 1.0f;
  return encode;
}

// div_rn(1, 6), the FP32 nearest 1/6 (bits 0x3E2AAAAB), as a constant: the device compiler does
// not fold a correctly rounded division, and the block scale below is computed per 16 values.
constexpr float kE2M1MaxReciprocal = 0.16666667163372039795f;

// s_b = e4m3(block_amax * (S_enc / 6)), the stored E4M3 block scale code.
SFMOE_HD uint8_t nvfp4_block_scale(float block_amax, float global_encode_scale) {
  return f32_to_e4m3(mul_rn(block_amax, mul_rn(global_encode_scale, kE2M1MaxReciprocal)));
}

// The group's decode scale 1 / S_enc (kernels compute it once per group, not once per block).
SFMOE_HD float nvfp4_global_decode_scale(float global_encode_scale) {
  return div_rn(1.0f, global_encode_scale);
}

// Element multiplier min(1 / (float(s_b) * (1 / S_enc)), FLT_MAX) (minNum: NaN -> FLT_MAX).
SFMOE_HD float nvfp4_block_multiplier_from_decode(uint8_t block_scale_code,
                                                  float global_decode_scale) {
  const float block_decode = mul_rn(e4m3_to_f32(block_scale_code), global_decode_scale);
  return min_num(div_rn(1.0f, block_decode), f32_max());
}
SFMOE_HD float nvfp4_block_multiplier(uint8_t block_scale_code, float global_encode_scale) {
  return nvfp4_block_multiplier_from_decode(block_scale_code,
                                            nvfp4_global_decode_scale(global_encode_scale));
}

}  // namespace numerics
}  // namespace sfmoe

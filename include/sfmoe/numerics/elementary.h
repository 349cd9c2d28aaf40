// Elementary functions computed from FP32 additions, multiplications and fused multiply-adds
// only, each rounded once, so that host and device give the same bits (libm's expf and the device's
// expf differ by an ulp here and there, and a routing decision taken on sigmoid(x) + bias must not
// depend on which one ran).
#pragma once

#include "sfmoe/numerics/bits.h"

namespace sfmoe {
namespace numerics {

// 2^n as an FP32, for -126 <= n <= 127.
SFMOE_HD float exp2_integer_f32(int n) { return bits_to_f32(static_cast<uint32_t>(n + 127) << 23); }

// e^x = p * 2^n for |x| < 2^21: x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite: ln2 split
// in two, each product with n subtracted by a fused multiply-add), p = e^r by its Taylor series to
// r^7 in Horner form of fused multiply-adds. Returns p; n comes back as the bits of the float
// `n + 1.5 * 2^23` (its low mantissa bits hold n), so callers form 2^n with integer operations
// instead of a float-to-int conversion.
SFMOE_HD float exp_reduced_f32(float x, uint32_t* n_bits) {
  constexpr float kLog2E = 1.44269502162933349609375f;
  constexpr float kLn2Hi = 0.693145751953125f;         // 15 significant bits
  constexpr float kLn2Lo = 1.428606765330187045e-06f;  // ln 2 - hi
  const float shifted = add_rn(mul_rn(x, kLog2E), kRoundingShift);
  const float n = add_rn(shifted, -kRoundingShift);
  *n_bits = f32_to_bits(shifted);
  const float r = fma_rn(-n, kLn2Lo, fma_rn(-n, kLn2Hi, x));
  constexpr float kCoefficients[] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                     1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
  float p = kCoefficients[0];
  SFMOE_UNROLL
  for (int i = 1; i < 8; ++i) p = fma_rn(p, r, kCoefficients[i]);
  return p;
}

// n of exp_reduced_f32's n_bits (an integer well inside +-2^22).
SFMOE_HD int exp_reduced_exponent(uint32_t n_bits) {
  return static_cast<int>(n_bits) - static_cast<int>(f32_to_bits(kRoundingShift));
}

// e^x: exp_reduced_f32, then two exact-or-once-rounded scalings by powers of two (a subnormal
// result is rounded once). NaN -> NaN; overflow -> +Inf; underflow -> +0. Measured within 1 ulp
// of e^x wherever the result is normal; the tests (tests/cpp/test_router_cpu.cpp) hold it to 2.
SFMOE_HD float exp_f32(float x) {
  // Without branches (the device evaluates eight of these per thread side by side): the general
  // path runs on x clamped into its range, and the special results are selected at the end.
  constexpr float kOverflow = 88.72283935546875f;        // e^x > FLT_MAX above
  constexpr float kUnderflow = -103.97208404541015625f;  // below half the least subnormal
  const float clamped = x > kOverflow ? kOverflow : (x < kUnderflow ? kUnderflow : x);
  uint32_t n_bits;
  const float p = exp_reduced_f32(clamped, &n_bits);
  const int exponent = exp_reduced_exponent(n_bits);  // in [-150, 128]
  const int half = exponent / 2;
  const float e = mul_rn(mul_rn(p, exp2_integer_f32(half)), exp2_integer_f32(exponent - half));
  if (f32_is_nan(x)) return bits_to_f32(kF32CanonicalNanBits);
  return x > kOverflow ? bits_to_f32(kF32InfBits) : (x < kUnderflow ? 0.0f : e);
}

// 1 / d rounded once, for d in [1, 2^126) (the sigmoid's denominators): in that range the
// device's correctly rounded reciprocal is its approximate reciprocal plus one Newton step by
// fused multiply-adds, with no range check; the host divides.
SFMOE_HD float rcp_rn_from_one(float d) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
#else
  return canonical_nan_if_nan(1.0f / d);
#endif
}

// 1 / (1 + e^-x), the router's sigmoid score and the activations' gate. e^-x is formed from
// exp_reduced_f32 on -x clamped into [-87, 87] with one scaling by 2^n (n in [-126, 126]: exact
// or rounded once), so the denominator lies in [1, 2^126) and its reciprocal needs no range
// check. x < -87 gives +0 (the true value is below 1.7e-38 there); x > 87 gives 1 (as rounding
// does); NaN gives NaN. Within 2 ulp of the true value wherever that is at least 2^-125.
SFMOE_HD float sigmoid_f32(float x) {
  constexpr float kRange = 87.0f;
  const float minus_x = -x;
  const float z = minus_x > kRange ? kRange : (minus_x < -kRange ? -kRange : minus_x);
  uint32_t n_bits;
  const float p = exp_reduced_f32(z, &n_bits);
  const float e = mul_rn(p, exp2_integer_f32(exp_reduced_exponent(n_bits)));  // n in [-126, 126]
  // A NaN x passes the clamp and every operation: s is the canonical NaN.
  const float s = rcp_rn_from_one(add_rn(1.0f, e));
  return x < -kRange ? 0.0f : s;
}

// FP32 arithmetic with every operation rounded once, the same on host and device: the arithmetic
// of the shared per-element rules (activations, router).
struct Fp32Arithmetic {
  using Real = float;
  static SFMOE_HD float add(float a, float b) { return add_rn(a, b); }
  static SFMOE_HD float mul(float a, float b) { return mul_rn(a, b); }
  static SFMOE_HD float div(float a, float b) { return div_rn(a, b); }
  static SFMOE_HD float exp(float a) { return exp_f32(a); }
  static SFMOE_HD float sigmoid(float a) { return sigmoid_f32(a); }
};

}  // namespace numerics
}  // namespace sfmoe

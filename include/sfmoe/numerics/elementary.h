// Elementary functions computed from FP32 additions, multiplications and fused multiply-adds
// only, each rounded once, so that host and device give the same bits (libm's expf and the device's
// expf differ by an ulp here and there, and a routing decision taken on sigmoid(x) + bias must not
// depend on which one ran).
#pragma once

#include "sfmoe/numerics/bits.h"

namespace sfmoe {
namespace numerics {

// Round to the nearest integer, ties to even, for |v| < 2^22 (adding 1.5 * 2^23 leaves a unit
// spacing, so the sum rounds v once).
SFMOE_HD float round_to_integer_f32(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return add_rn(add_rn(v, kMagic), -kMagic);
}

// 2^n as an FP32, for -126 <= n <= 127.
SFMOE_HD float exp2_integer_f32(int n) { return bits_to_f32(static_cast<uint32_t>(n + 127) << 23); }

// e^x. x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite: ln2 split in two, each product with n
// subtracted by a fused multiply-add), e^r by its Taylor series to r^7 in Horner form of fused
// multiply-adds, then two exact-or-once-rounded scalings by powers of two (a subnormal result is
// rounded once). NaN -> NaN; overflow -> +Inf; underflow -> +0. Measured within 1 ulp of e^x
// wherever the result is normal; the tests (tests/cpp/test_router_cpu.cpp) hold it to 2.
SFMOE_HD float exp_f32(float x) {
  // Without branches (the device evaluates eight of these per thread side by side): the general
  // path runs on x clamped into its range, and the special results are selected at the end.
  constexpr float kOverflow = 88.72283935546875f;        // e^x > FLT_MAX above
  constexpr float kUnderflow = -103.97208404541015625f;  // below half the least subnormal
  constexpr float kLog2E = 1.44269502162933349609375f;
  constexpr float kLn2Hi = 0.693145751953125f;         // 15 significant bits
  constexpr float kLn2Lo = 1.428606765330187045e-06f;  // ln 2 - hi
  const float clamped = x > kOverflow ? kOverflow : (x < kUnderflow ? kUnderflow : x);
  const float n = round_to_integer_f32(mul_rn(clamped, kLog2E));
  const float r = fma_rn(-n, kLn2Lo, fma_rn(-n, kLn2Hi, clamped));
  constexpr float kCoefficients[] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                     1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
  float p = kCoefficients[0];
  SFMOE_UNROLL
  for (int i = 1; i < 8; ++i) p = fma_rn(p, r, kCoefficients[i]);
  const int exponent = static_cast<int>(n);  // in [-150, 128]
  const int half = exponent / 2;
  const float e = mul_rn(mul_rn(p, exp2_integer_f32(half)), exp2_integer_f32(exponent - half));
  if (f32_is_nan(x)) return bits_to_f32(kF32CanonicalNanBits);
  return x > kOverflow ? bits_to_f32(kF32InfBits) : (x < kUnderflow ? 0.0f : e);
}

// 1 / (1 + e^-x), the router's sigmoid score and the SiLU gate.
SFMOE_HD float sigmoid_f32(float x) { return rcp_rn(add_rn(1.0f, exp_f32(-x))); }

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

// Host checks of include/sfmoe/numerics/ against independent slow references (exhaustive where
// the domain is small) and against published answer vectors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "sfmoe/numerics.h"
#include "tests/cpp/numerics_cases.h"
#include "tests/cpp/numerics_reference.h"

namespace sfmoe {
namespace testing {
namespace {

using namespace numerics;

TEST(Numerics, EveryFunctionMatchesItsIndependentReference) {
  const std::vector<NumericsCase> cases = make_numerics_cases(session_test_seed());
  int64_t total = 0;
  for (const NumericsCase& c : cases) {
    int64_t checked = 0, mismatches = 0;
    for (size_t i = 0; i < c.a.size(); ++i) {
      uint32_t expected;
      if (!reference_numerics(c.fn, c.a[i], c.b[i], &expected)) break;
      const uint32_t got = eval_numerics(c.fn, c.a[i], c.b[i]);
      ++checked;
      if (!same_result(c.fn, got, expected)) {
        if (++mismatches <= 5) {
          ADD_FAILURE() << c.name << "(a=0x" << std::hex << c.a[i] << ", b=0x" << c.b[i]
                        << "): got 0x" << got << ", reference 0x" << expected;
        }
      }
    }
    total += checked;
    EXPECT_EQ(mismatches, 0) << c.name;
    if (checked > 0)
      std::printf("[ numerics ] %-24s %9lld inputs match the reference\n", c.name.c_str(),
                  static_cast<long long>(checked));
  }
  std::printf("[ numerics ] %lld values checked against independent references\n",
              static_cast<long long>(total));
  EXPECT_GT(total, 1000000);
}

// byte_perm on the host, as CUDA documents __byte_perm: result byte k is byte selector[k] of
// {b:a}.
TEST(Numerics, BytePermSelectsBytesOfTheEightByteConcatenation) {
  const uint32_t a = 0x33221100u, b = 0x77665544u;
  EXPECT_EQ(byte_perm(a, b, 0x3210u), a);
  EXPECT_EQ(byte_perm(a, b, 0x7654u), b);
  EXPECT_EQ(byte_perm(a, b, 0x7610u), 0x77661100u);
  EXPECT_EQ(byte_perm(a, b, 0x0073u), 0x00007733u);
  EXPECT_EQ(byte_perm(a, b, 0x4567u), 0x44556677u);
}

// The eight-value E2M1 packer (magnitudes summed as biased candidates) against eight single
// encodes: random floats of every magnitude and the special values (+-0, subnormals, the ties,
// 6 and beyond, +-Inf, the canonical NaN) in every nibble position.
TEST(Numerics, E2M1PackerOfEightEqualsEightEncodes) {
  std::mt19937 rng(session_test_seed());
  const float specials[] = {0.0f,
                            -0.0f,
                            1e-40f,
                            -1e-45f,
                            0.25f,
                            -0.75f,
                            1.25f,
                            1.75f,
                            -2.5f,
                            3.5f,
                            5.0f,
                            -6.0f,
                            7.0f,
                            -1e30f,
                            INFINITY,
                            -INFINITY,
                            bits_to_f32(kF32CanonicalNanBits)};
  constexpr int kSpecials = sizeof(specials) / sizeof(specials[0]);
  for (int trial = 0; trial < 200000; ++trial) {
    float x[8];
    uint32_t want = 0;
    for (int k = 0; k < 8; ++k) {
      const uint32_t pick = rng();
      if (pick % 4 == 0) {
        x[k] = specials[(pick >> 8) % kSpecials];
      } else if (pick % 4 == 1) {
        x[k] = bits_to_f32(rng());                                       // any float...
        if (f32_is_nan(x[k])) x[k] = bits_to_f32(kF32CanonicalNanBits);  // ...with canonical NaNs
      } else {
        x[k] = std::ldexp(static_cast<float>(static_cast<int32_t>(rng())) / 2147483648.0f, 3);
      }
      want |= static_cast<uint32_t>(f32_to_e2m1(x[k])) << (4 * k);
    }
    ASSERT_EQ(pack_e2m1x8_canonical_nan(x), want) << "trial " << trial;
  }
}

// The branch-free E4M3 decoder against the generic field decoder, every code, bit for bit; the
// constant 1/6 of the NVFP4 block scale against the division it replaces.
TEST(Numerics, E4M3DecoderEqualsTheGenericDecoderOnEveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    EXPECT_EQ(f32_to_bits(e4m3_to_f32(code)), f32_to_bits(decode_narrow<FormatE4M3>(code)))
        << "e4m3 0x" << std::hex << c;
  }
  EXPECT_EQ(f32_to_bits(kE2M1MaxReciprocal), f32_to_bits(div_rn(1.0f, kE2M1Max)));
}

TEST(Numerics, EveryFp8AndFp4CodeDecodesAndReencodesToItself) {
  for (uint32_t c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const bool e4m3_nan = (c & 0x7F) == 0x7F;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(code)), e4m3_nan ? 0x7F : code) << "e4m3 " << c;
    const bool e5m2_special = (c & 0x7C) == 0x7C;  // Inf or NaN
    if (!e5m2_special) {
      EXPECT_EQ(f32_to_e5m2(e5m2_to_f32(code)), code) << "e5m2 " << c;
    }
  }
  // E5M2 infinities saturate on the way back (the FP8 casts are saturating).
  EXPECT_EQ(f32_to_e5m2(e5m2_to_f32(0x7C)), 0x7B);
  EXPECT_EQ(f32_to_e5m2(e5m2_to_f32(0xFC)), 0xFB);
  EXPECT_EQ(f32_to_e5m2(e5m2_to_f32(0x7D)), 0x7F);
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(c)), c) << "e2m1 " << int(c);
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    const bool bf16_nan = (c & 0x7F80) == 0x7F80 && (c & 0x7F) != 0;
    const bool fp16_nan = (c & 0x7C00) == 0x7C00 && (c & 0x3FF) != 0;
    EXPECT_EQ(f32_to_bf16(bf16_to_f32(code)), bf16_nan ? 0x7FFF : code);
    EXPECT_EQ(f32_to_fp16(fp16_to_f32(code)), fp16_nan ? 0x7FFF : code);
  }
}

TEST(Numerics, ComparisonE2M1EncoderEqualsTheGenericRounding) {
  int64_t checked = 0;
  for (const NumericsCase& c : make_numerics_cases(session_test_seed())) {
    if (c.fn != NumericsFn::kE2M1Encode) continue;
    for (uint32_t a : c.a) {
      const float x = bits_to_f32(a);
      ASSERT_EQ(f32_to_e2m1(x), encode_narrow<FormatE2M1>(x)) << std::hex << a;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000000);
}

// Over every float: how many give different codes from two encoders, and the bits of the first.
struct FloatDifferences {
  uint64_t count = 0;
  uint32_t first = 0;
};
template <class Encoder, class Definition>
FloatDifferences differences_on_every_float(Encoder encoder, Definition definition) {
  FloatDifferences d;
  for (uint64_t a = 0; a <= 0xFFFFFFFFull; ++a) {
    const float x = bits_to_f32(static_cast<uint32_t>(a));
    if (encoder(x) != definition(x) && d.count++ == 0) d.first = static_cast<uint32_t>(a);
  }
  return d;
}

// The E2M1 encoders against their earlier definition (seven comparisons with the midpoints, itself
// checked against the generic rounding above), on every float.
TEST(Numerics, E2M1EncoderEqualsTheMidpointComparisonsOnEveryFloat) {
  auto by_midpoints = [](float x) -> uint8_t {
    const uint32_t bits = f32_to_bits(x);
    const uint32_t abs_bits = bits & kF32AbsMask;
    if (abs_bits > kF32InfBits) return FormatE2M1::kNanCode;
    const float m = bits_to_f32(abs_bits);
    const uint32_t code = (m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) + (m > 2.5f) +
                          (m >= 3.5f) + (m > 5.0f);
    return static_cast<uint8_t>(((bits >> 28) & 0x8u) | code);
  };
  // Both forms: f32_to_e2m1 on every float, and the canonical-NaN form on every float but the
  // negative NaNs (a difference between them reads as 0xFF, which is no code).
  auto both_forms = [](float x) -> uint8_t {
    const uint8_t code = f32_to_e2m1(x);
    const bool negative_nan = f32_to_bits(x) > 0xFF800000u;
    if (!negative_nan && f32_to_e2m1_canonical_nan(x) != code) return 0xFF;
    return code;
  };
  const FloatDifferences d = differences_on_every_float(both_forms, by_midpoints);
  EXPECT_EQ(d.count, 0u) << "first at bits 0x" << std::hex << d.first;
}

// The E8M0 encoder (selects) against its earlier definition by branches (itself checked against
// the independent reference above), on every float.
TEST(Numerics, E8M0EncoderEqualsItsBranchDefinitionOnEveryFloat) {
  auto by_branches = [](float x) -> uint8_t {
    const uint32_t abs_bits = f32_to_bits(x) & kF32AbsMask;
    if (abs_bits > kF32InfBits) return kE8M0Nan;
    if (abs_bits == kF32InfBits) return 0xFE;
    uint32_t exponent = abs_bits >> kF32MantissaBits;
    const uint32_t mantissa = abs_bits & kF32MantissaMask;
    if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
    return static_cast<uint8_t>(exponent);
  };
  const FloatDifferences d =
      differences_on_every_float([](float x) { return f32_to_e8m0(x); }, by_branches);
  EXPECT_EQ(d.count, 0u) << "first at bits 0x" << std::hex << d.first;
}

TEST(Numerics, KnownAnswersFromTheDesign) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);  // would round to 480: saturates
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(f32_to_e4m3(NAN), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-NAN), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -9)), 0x01);   // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half of it: tie to even (0)
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(f32_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(INFINITY), 0x7B);
  EXPECT_EQ(f32_to_e2m1(6.0f), 0x7);
  EXPECT_EQ(f32_to_e2m1(NAN), 0x7);
  EXPECT_EQ(f32_to_e2m1(0.25f), 0x0);        // tie between 0 and 0.5: even
  EXPECT_EQ(f32_to_e2m1(0.75f), 0x2);        // tie between 0.5 and 1: even (1.0, code 2)
  EXPECT_EQ(f32_to_e2m1(-2.5f), 0xC);        // tie between 2 and 3: even (2)
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7C00);  // overflow threshold -> Inf
  EXPECT_EQ(f32_to_fp16(65519.0f), 0x7BFF);
  // E8M0: the three exceptions to rounding up.
  EXPECT_EQ(f32_to_e8m0(bits_to_f32(0x7F7FFFFF)), 254);  // exponent 254: no round-up
  EXPECT_EQ(f32_to_e8m0(bits_to_f32(0x00400000)), 0);    // subnormal, mantissa <= 0x400000
  EXPECT_EQ(f32_to_e8m0(bits_to_f32(0x00400001)), 1);
  EXPECT_EQ(f32_to_e8m0(bits_to_f32(0x3F800001)), 128);
  EXPECT_EQ(mx_multiplier(127), 1.0f);
  EXPECT_EQ(mx_multiplier(0), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(mx_multiplier(255)));
  // FP8 current scaling.
  EXPECT_EQ(fp8_scale_from_amax(NAN, 448.0f, false), 1.0f);
  EXPECT_EQ(fp8_scale_from_amax(INFINITY, 448.0f, false), 1.0f);
  EXPECT_EQ(fp8_scale_from_amax(1e-45f, 448.0f, false), FLT_MAX);
  EXPECT_EQ(fp8_scale_from_amax(1e-45f, 448.0f, true), std::ldexp(1.0f, 127));
  EXPECT_EQ(scale_inverse(fp8_scale_from_amax(3.5f, 448.0f, false)), 3.5f / 448.0f);
  // NVFP4.
  EXPECT_EQ(nvfp4_global_encode_scale(INFINITY), 1.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(NAN), FLT_MAX);
  EXPECT_EQ(nvfp4_global_encode_scale(1.0f), 2688.0f);
  EXPECT_EQ(nvfp4_block_scale(6.0f, 1.0f), f32_to_e4m3(1.0f));
  EXPECT_EQ(nvfp4_block_multiplier(f32_to_e4m3(0.0f), 1.0f), FLT_MAX);
}

// Random123's published answers for Philox4x32-10.
// The router's logit-order top-k (src/cuda/router/router.cu, top_k_by_logit_order) rests on this:
// sigmoid_f32 is monotone up to one ulp. Over every float in [-87, 87] in increasing order, no
// value lies more than one ulp below the largest one before it (it does dip by one ulp at some
// floats: rounding). Outside that range the function is constant by construction (0 below -87,
// the value at 87 above it), and +0 and -0 score the same.
TEST(Numerics, SigmoidIsMonotoneWithinOneUlp) {
  using numerics::bits_to_f32;
  using numerics::f32_to_bits;
  using numerics::sigmoid_f32;
  float running = 0.0f;
  uint64_t dips = 0, broken = 0, checked = 0;
  auto visit = [&](uint32_t bits) {
    const float s = sigmoid_f32(bits_to_f32(bits));
    dips += s < running;
    if (running > numerics::f32_next_up_nonnegative(s)) {
      if (broken++ < 5) ADD_FAILURE() << "at x = " << bits_to_f32(bits) << ": " << s;
    }
    running = s > running ? s : running;
    ++checked;
  };
  const uint32_t minus_87 = f32_to_bits(-87.0f), plus_87 = f32_to_bits(87.0f);
  for (uint32_t b = minus_87; b > 0x80000000u; --b) visit(b);  // -87 .. the least negative
  visit(0x80000000u);                                          // -0
  for (uint32_t b = 0u; b <= plus_87; ++b) visit(b);           // +0 .. 87
  EXPECT_EQ(broken, 0u);
  EXPECT_GT(dips, 0u);  // (the property is "within one ulp", not exact monotonicity)
  EXPECT_EQ(f32_to_bits(sigmoid_f32(-0.0f)), f32_to_bits(sigmoid_f32(0.0f)));
  EXPECT_GT(sigmoid_f32(-87.0f), 0.0f);
  for (float x : {-87.00001f, -100.0f, -1e30f, -INFINITY}) EXPECT_EQ(sigmoid_f32(x), 0.0f) << x;
  for (float x : {87.00001f, 100.0f, 1e30f, INFINITY}) {
    EXPECT_EQ(f32_to_bits(sigmoid_f32(x)), f32_to_bits(sigmoid_f32(87.0f))) << x;
  }
  std::printf(
      "[ numerics ] sigmoid over %llu floats in [-87, 87]: %llu one-ulp dips, none deeper\n",
      static_cast<unsigned long long>(checked), static_cast<unsigned long long>(dips));
}

TEST(Numerics, PhiloxMatchesPublishedAnswerVectors) {
  struct Vector {
    Philox4x32 counter;
    uint32_t key0, key1;
    Philox4x32 expected;
  };
  const Vector vectors[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Vector& v : vectors) {
    const Philox4x32 got = philox4x32_10(v.counter, v.key0, v.key1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], v.expected.v[i]) << "word " << i;
  }
  // The per-element stream: element i is word i % 4 of block i / 4, so it is reproducible
  // from (seed, offset, index) alone and independent of how work is split.
  const uint64_t seed = session_test_seed();
  for (uint64_t i = 0; i < 64; ++i) {
    const Philox4x32 block =
        philox4x32_10({{static_cast<uint32_t>(i / 4), 0, 7, 0}}, static_cast<uint32_t>(seed),
                      static_cast<uint32_t>(seed >> 32));
    EXPECT_EQ(philox_random_bits(seed, 7, i), block.v[i % 4]);
  }
}

TEST(Numerics, StochasticRoundingIsUnbiased) {
  std::mt19937_64 rng(session_test_seed());
  for (float x : {0.1f, 0.3f, 0.74f, 1.2f, 2.5f, -3.3f, 4.9f, 5.99f}) {
    double sum = 0.0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
      sum += e2m1_to_f32(f32_to_e2m1_stochastic(x, philox_random_bits(rng(), 0, i)));
    }
    // Each draw is within one E2M1 step (<= 2) of x: 5 sigma of the mean is < 5 * 2 / sqrt(n).
    EXPECT_NEAR(sum / n, x, 5.0 * 2.0 / std::sqrt(static_cast<double>(n))) << x;
  }
  // Representable values never move, whatever the random bits.
  for (uint8_t c = 0; c < 16; ++c) {
    EXPECT_EQ(f32_to_e2m1_stochastic(e2m1_to_f32(c), 0xFFFFFFFFu), c);
    EXPECT_EQ(f32_to_e2m1_stochastic(e2m1_to_f32(c), 0u), c);
  }
}

TEST(Numerics, HadamardSignVectorAndTransform) {
  const float signs[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(hadamard_sign(i), signs[i]) << i;
  std::mt19937_64 rng(session_test_seed());
  std::uniform_int_distribution<int> small(-1000, 1000);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    float v[16], x[16];
    const bool integers = trial % 2 == 0;
    for (int i = 0; i < 16; ++i)
      x[i] = v[i] = integers ? static_cast<float>(small(rng)) : normal(rng);
    hadamard16_transform(v);
    double norm = 0.0;
    for (int i = 0; i < 16; ++i) norm += double(x[i]) * x[i];
    for (int i = 0; i < 16; ++i) {
      double expected = 0.0;  // sum_j (-1)^popcount(i & j) s_j x_j / 4, in double
      for (int j = 0; j < 16; ++j) {
        const double h = (__builtin_popcount(i & j) & 1) ? -1.0 : 1.0;
        expected += h * signs[j] * x[j];
      }
      expected /= 4.0;
      if (integers) {
        EXPECT_EQ(v[i], static_cast<float>(expected));  // exact: all sums are small integers / 4
      } else {
        EXPECT_NEAR(v[i], expected, 1e-6 * std::sqrt(norm) + 1e-30);
      }
    }
    // Orthonormal: the norm is kept.
    double out_norm = 0.0;
    for (int i = 0; i < 16; ++i) out_norm += double(v[i]) * v[i];
    EXPECT_NEAR(out_norm, norm, 1e-5 * norm + 1e-30);
  }
}

TEST(Numerics, SwizzledScaleLayoutIsABijectionOntoThePaddedBuffer) {
  for (int64_t rows : {1, 31, 128, 129, 300}) {
    for (int64_t cols : {1, 3, 4, 5, 13, 64}) {
      const int64_t padded = swizzled_scale_padded_size(rows, cols);
      const int64_t padded_rows = round_up(rows, 128), padded_cols = round_up(cols, 4);
      EXPECT_EQ(padded, padded_rows * padded_cols);
      std::vector<int> hits(static_cast<size_t>(padded), 0);
      for (int64_t r = 0; r < padded_rows; ++r) {
        for (int64_t c = 0; c < padded_cols; ++c) {
          const int64_t o = swizzled_scale_offset(r, c, cols);
          ASSERT_GE(o, 0);
          ASSERT_LT(o, padded);
          ++hits[static_cast<size_t>(o)];
        }
      }
      for (int h : hits) ASSERT_EQ(h, 1) << rows << "x" << cols;
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

#include "tests/cpp/numerics_cases.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace sfmoe {
namespace testing {

uint64_t fresh_test_seed() {
  if (const char* env = std::getenv("SFMOE_TEST_SEED")) return std::strtoull(env, nullptr, 0);
  std::random_device device;
  const uint64_t now =
      static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return (static_cast<uint64_t>(device()) << 32) ^ device() ^ now;
}

uint64_t session_test_seed() {
  static const uint64_t seed = [] {
    const uint64_t s = fresh_test_seed();
    std::printf("[ numerics ] random seed %llu (replay with SFMOE_TEST_SEED=%llu)\n",
                static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::vector<uint32_t> special_f32_bits() {
  std::vector<uint32_t> v = {
      0x00000000u, 0x80000000u,  // +-0
      0x00000001u, 0x80000001u,  // smallest subnormals
      0x00400000u, 0x00400001u, 0x003FFFFFu, 0x007FFFFFu,
      0x807FFFFFu, 0x00800000u, 0x80800000u,  // smallest normals
      0x7F7FFFFFu, 0xFF7FFFFFu,               // +-FLT_MAX
      0x7F800000u, 0xFF800000u,               // +-Inf
      0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
      0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FA00000u};  // NaNs: quiet, signalling, payloads
  for (uint32_t e = 0; e < 255; ++e) {
    for (uint32_t m : {0u, 1u, 0x400000u, 0x400001u, 0x7FFFFFu, 0x3FFFFFu}) {
      v.push_back((e << 23) | m);
      v.push_back(0x80000000u | (e << 23) | m);
    }
  }
  return v;
}

namespace {

// Values next to every representable value of a narrow format and next to the midpoints between
// neighbours: where round-to-nearest-even decides.
template <class Decode>
std::vector<uint32_t> rounding_boundaries(int codes, Decode decode) {
  std::vector<float> values;
  for (int c = 0; c < codes; ++c) {
    const float v = decode(static_cast<uint32_t>(c));
    if (!numerics::f32_is_nan(v) && !numerics::f32_is_inf(v) && v >= 0.0f) values.push_back(v);
  }
  std::vector<uint32_t> out;
  auto push_around = [&](float v) {
    const uint32_t bits = numerics::f32_to_bits(v);
    for (int d = -2; d <= 2; ++d) {
      const uint32_t b = bits + static_cast<uint32_t>(d);
      if (d < 0 && bits < static_cast<uint32_t>(-d)) continue;
      out.push_back(b);
      out.push_back(b | 0x80000000u);
    }
  };
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  for (size_t i = 0; i < values.size(); ++i) {
    push_around(values[i]);
    // The midpoint to the next value is exact in FP32 for every format here.
    if (i + 1 < values.size()) push_around(values[i] + (values[i + 1] - values[i]) * 0.5f);
  }
  // Beyond the largest value: where saturation / overflow to Inf starts.
  float largest = 0.0f;
  for (float v : values) largest = v > largest ? v : largest;
  for (float f : {1.03125f, 1.0625f, 1.125f, 1.5f, 2.0f, 1e3f}) push_around(largest * f);
  return out;
}

void append(std::vector<uint32_t>* to, const std::vector<uint32_t>& from) {
  to->insert(to->end(), from.begin(), from.end());
}

}  // namespace

std::vector<NumericsCase> make_numerics_cases(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto random_u32 = [&] { return static_cast<uint32_t>(rng()); };
  std::vector<NumericsCase> cases;

  // Encoder inputs: every BF16 bit pattern, the specials, rounding boundaries of every format,
  // and fresh random FP32 patterns (uniform bits, and values near the formats' ranges).
  std::vector<uint32_t> encoder_inputs;
  for (uint32_t p = 0; p < 65536; ++p) encoder_inputs.push_back(p << 16);
  append(&encoder_inputs, special_f32_bits());
  append(&encoder_inputs,
         rounding_boundaries(128, [](uint32_t c) { return numerics::e4m3_to_f32(c); }));
  append(&encoder_inputs,
         rounding_boundaries(128, [](uint32_t c) { return numerics::e5m2_to_f32(c); }));
  append(&encoder_inputs,
         rounding_boundaries(8, [](uint32_t c) { return numerics::e2m1_to_f32(c); }));
  append(&encoder_inputs,
         rounding_boundaries(32768, [](uint32_t c) { return numerics::fp16_to_f32(c); }));
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
  for (int i = 0; i < 200000; ++i) {
    encoder_inputs.push_back(random_u32());
    const float magnitude = std::exp2(exponent(rng));
    encoder_inputs.push_back(numerics::f32_to_bits((rng() & 1) ? -magnitude : magnitude));
  }
  const std::vector<uint32_t> zeros(encoder_inputs.size(), 0u);
  for (NumericsFn fn :
       {NumericsFn::kE4M3Encode, NumericsFn::kE5M2Encode, NumericsFn::kE2M1Encode,
        NumericsFn::kBf16Encode, NumericsFn::kFp16Encode, NumericsFn::kE8M0Encode,
        NumericsFn::kMxScaleE4M3, NumericsFn::kMxScaleE5M2, NumericsFn::kFp8ScaleE4M3,
        NumericsFn::kFp8ScaleE4M3Pow2, NumericsFn::kFp8ScaleE5M2, NumericsFn::kScaleInverse,
        NumericsFn::kNvfp4GlobalScale, NumericsFn::kExp, NumericsFn::kSigmoid}) {
    cases.push_back({fn, "", encoder_inputs, zeros});
  }

  // The sigmoid's reciprocal over its whole domain [1, 2^126): every fourth significand of
  // [1, 2) (the rounding depends on the significand only), random values across the exponents,
  // and the ends.
  {
    NumericsCase rcp{NumericsFn::kRcpFromOne, "", {}, {}};
    for (uint32_t m = 0; m < (1u << 23); m += 4)
      rcp.a.push_back(0x3F800000u | m | (random_u32() & 3u));
    std::uniform_int_distribution<uint32_t> bits(0x3F800000u, 0x7E7FFFFFu);
    for (int i = 0; i < 300000; ++i) rcp.a.push_back(bits(rng));
    for (uint32_t edge : {0x3F800000u, 0x3F800001u, 0x3FFFFFFFu, 0x7E7FFFFFu, 0x7E7FFFFEu})
      rcp.a.push_back(edge);
    rcp.b.assign(rcp.a.size(), 0u);
    cases.push_back(rcp);
  }

  // Decoders: every code.
  auto all_codes = [](uint32_t n) {
    std::vector<uint32_t> v(n);
    for (uint32_t i = 0; i < n; ++i) v[i] = i;
    return v;
  };
  cases.push_back({NumericsFn::kE4M3Decode, "", all_codes(256), std::vector<uint32_t>(256, 0)});
  cases.push_back({NumericsFn::kE5M2Decode, "", all_codes(256), std::vector<uint32_t>(256, 0)});
  cases.push_back({NumericsFn::kE2M1Decode, "", all_codes(16), std::vector<uint32_t>(16, 0)});
  cases.push_back({NumericsFn::kBf16Decode, "", all_codes(65536), std::vector<uint32_t>(65536, 0)});
  cases.push_back({NumericsFn::kFp16Decode, "", all_codes(65536), std::vector<uint32_t>(65536, 0)});
  cases.push_back({NumericsFn::kE8M0Decode, "", all_codes(256), std::vector<uint32_t>(256, 0)});
  cases.push_back({NumericsFn::kMxMultiplier, "", all_codes(256), std::vector<uint32_t>(256, 0)});

  // NVFP4 block scales and multipliers: amax / code against a spread of global scales.
  {
    std::vector<uint32_t> globals;
    for (float g : {1.0f, 0.5f, 3.0f, 1e-3f, 1e6f, 2688.0f / 7.25f, 3.4e38f}) {
      globals.push_back(numerics::f32_to_bits(g));
    }
    for (int i = 0; i < 64; ++i) {
      globals.push_back(numerics::f32_to_bits(numerics::nvfp4_global_encode_scale(
          numerics::bits_to_f32(encoder_inputs[random_u32() % encoder_inputs.size()]))));
    }
    NumericsCase block{NumericsFn::kNvfp4BlockScale, "", {}, {}};
    NumericsCase multiplier{NumericsFn::kNvfp4BlockMultiplier, "", {}, {}};
    const std::vector<uint32_t> specials = special_f32_bits();
    for (uint32_t g : globals) {
      for (uint32_t s : specials) {
        block.a.push_back(s & 0x7FFFFFFFu);
        block.b.push_back(g);
      }
      for (int i = 0; i < 2000; ++i) {
        block.a.push_back(random_u32() & 0x7FFFFFFFu);
        block.b.push_back(g);
      }
      for (uint32_t code = 0; code < 256; ++code) {
        multiplier.a.push_back(code);
        multiplier.b.push_back(g);
      }
    }
    cases.push_back(block);
    cases.push_back(multiplier);
  }

  // Stochastic rounding: magnitudes across and beyond the E2M1 range, random bits, and the bit
  // patterns at the decision threshold.
  {
    NumericsCase sr{NumericsFn::kE2M1Stochastic, "", {}, {}};
    std::uniform_real_distribution<float> x(-7.0f, 7.0f);
    for (int i = 0; i < 200000; ++i) {
      sr.a.push_back(numerics::f32_to_bits(x(rng)));
      sr.b.push_back(random_u32());
    }
    for (uint32_t s : special_f32_bits()) {
      for (uint32_t r : {0u, 1u, 0x80000000u, 0xFFFFFFFFu}) {
        sr.a.push_back(s);
        sr.b.push_back(r);
      }
    }
    cases.push_back(sr);
  }

  // Philox: consecutive indices (the 4-per-call grouping) and random ones, random seeds.
  {
    NumericsCase philox{NumericsFn::kPhiloxBits, "", {}, {}};
    for (int s = 0; s < 8; ++s) {
      const uint32_t seed_word = random_u32();
      for (uint32_t i = 0; i < 4096; ++i) {
        philox.a.push_back(i);
        philox.b.push_back(seed_word);
      }
      for (int i = 0; i < 4096; ++i) {
        philox.a.push_back(random_u32());
        philox.b.push_back(seed_word);
      }
    }
    cases.push_back(philox);
  }

  // Swizzle offsets over a padded 300 x 13 scale matrix (three row tiles, a partial column tile).
  {
    NumericsCase swizzle{NumericsFn::kSwizzleOffset, "", {}, {}};
    for (uint32_t r = 0; r < 300; ++r) {
      for (uint32_t c = 0; c < kSwizzleTestCols; ++c) {
        swizzle.a.push_back(r);
        swizzle.b.push_back(c);
      }
    }
    cases.push_back(swizzle);
  }

  static const char* const kNames[] = {"e4m3_encode",
                                       "e5m2_encode",
                                       "e2m1_encode",
                                       "bf16_encode",
                                       "fp16_encode",
                                       "e4m3_decode",
                                       "e5m2_decode",
                                       "e2m1_decode",
                                       "bf16_decode",
                                       "fp16_decode",
                                       "e8m0_encode",
                                       "e8m0_decode",
                                       "mx_multiplier",
                                       "mx_scale_e4m3",
                                       "mx_scale_e5m2",
                                       "fp8_scale_e4m3",
                                       "fp8_scale_e4m3_pow2",
                                       "fp8_scale_e5m2",
                                       "scale_inverse",
                                       "nvfp4_global_scale",
                                       "nvfp4_block_scale",
                                       "nvfp4_block_multiplier",
                                       "e2m1_stochastic",
                                       "philox_bits",
                                       "swizzle_offset",
                                       "exp",
                                       "sigmoid",
                                       "rcp_from_one"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<int>(NumericsFn::kCount),
                "a name per function");
  for (NumericsCase& c : cases) c.name = kNames[static_cast<int>(c.fn)];
  return cases;
}

}  // namespace testing
}  // namespace sfmoe

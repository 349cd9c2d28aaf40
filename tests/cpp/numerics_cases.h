// The numerics functions under test, as one table that host and device code evaluate alike:
// each case is (function, a, b) -> 32-bit result. The GPU suite runs the same table in a kernel
// and demands the same bits.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "sfmoe/numerics.h"

namespace sfmoe {
namespace testing {

enum class NumericsFn : int {
  kE4M3Encode,  // a: fp32 bits
  kE5M2Encode,
  kE2M1Encode,
  kBf16Encode,
  kFp16Encode,
  kE4M3Decode,  // a: code -> fp32 bits
  kE5M2Decode,
  kE2M1Decode,
  kBf16Decode,
  kFp16Decode,
  kE8M0Encode,    // a: fp32 bits
  kE8M0Decode,    // a: code
  kMxMultiplier,  // a: e8m0 code
  kMxScaleE4M3,   // a: amax bits
  kMxScaleE5M2,
  kFp8ScaleE4M3,  // a: amax bits
  kFp8ScaleE4M3Pow2,
  kFp8ScaleE5M2,
  kScaleInverse,          // a: scale bits
  kNvfp4GlobalScale,      // a: global amax bits
  kNvfp4BlockScale,       // a: block amax bits, b: global encode scale bits
  kNvfp4BlockMultiplier,  // a: e4m3 block scale code, b: global encode scale bits
  kE2M1Stochastic,        // a: fp32 bits, b: random bits
  kPhiloxBits,            // a: element index, b: seed (offset fixed)
  kSwizzleOffset,         // a: row, b: col (scale_cols = kSwizzleTestCols)
  kExp,                   // a: fp32 bits (accuracy: tests/cpp/test_router_cpu.cpp)
  kSigmoid,
  kRcpFromOne,  // a: fp32 bits in [1, 2^126)
  kCount
};

constexpr int64_t kSwizzleTestCols = 13;
constexpr uint64_t kPhiloxTestOffset = 0x243F6A8885A308D3ull;

SFMOE_HD uint32_t eval_numerics(NumericsFn fn, uint32_t a, uint32_t b) {
  using namespace numerics;
  const float fa = bits_to_f32(a);
  const float fb = bits_to_f32(b);
  switch (fn) {
    case NumericsFn::kE4M3Encode:
      return f32_to_e4m3(fa);
    case NumericsFn::kE5M2Encode:
      return f32_to_e5m2(fa);
    case NumericsFn::kE2M1Encode:
      return f32_to_e2m1(fa);
    case NumericsFn::kBf16Encode:
      return f32_to_bf16(fa);
    case NumericsFn::kFp16Encode:
      return f32_to_fp16(fa);
    case NumericsFn::kE4M3Decode:
      return f32_to_bits(e4m3_to_f32(static_cast<uint8_t>(a)));
    case NumericsFn::kE5M2Decode:
      return f32_to_bits(e5m2_to_f32(static_cast<uint8_t>(a)));
    case NumericsFn::kE2M1Decode:
      return f32_to_bits(e2m1_to_f32(static_cast<uint8_t>(a)));
    case NumericsFn::kBf16Decode:
      return f32_to_bits(bf16_to_f32(static_cast<uint16_t>(a)));
    case NumericsFn::kFp16Decode:
      return f32_to_bits(fp16_to_f32(static_cast<uint16_t>(a)));
    case NumericsFn::kE8M0Encode:
      return f32_to_e8m0(fa);
    case NumericsFn::kE8M0Decode:
      return f32_to_bits(e8m0_to_f32(static_cast<uint8_t>(a)));
    case NumericsFn::kMxMultiplier:
      return f32_to_bits(mx_multiplier(static_cast<uint8_t>(a)));
    case NumericsFn::kMxScaleE4M3:
      return mx_scale_from_amax(fa, kE4M3Max);
    case NumericsFn::kMxScaleE5M2:
      return mx_scale_from_amax(fa, kE5M2Max);
    case NumericsFn::kFp8ScaleE4M3:
      return f32_to_bits(fp8_scale_from_amax(fa, kE4M3Max, false));
    case NumericsFn::kFp8ScaleE4M3Pow2:
      return f32_to_bits(fp8_scale_from_amax(fa, kE4M3Max, true));
    case NumericsFn::kFp8ScaleE5M2:
      return f32_to_bits(fp8_scale_from_amax(fa, kE5M2Max, false));
    case NumericsFn::kScaleInverse:
      return f32_to_bits(scale_inverse(fa));
    case NumericsFn::kNvfp4GlobalScale:
      return f32_to_bits(nvfp4_global_encode_scale(fa));
    case NumericsFn::kNvfp4BlockScale:
      return nvfp4_block_scale(fa, fb);
    case NumericsFn::kNvfp4BlockMultiplier:
      return f32_to_bits(nvfp4_block_multiplier(static_cast<uint8_t>(a), fb));
    case NumericsFn::kE2M1Stochastic:
      return f32_to_e2m1_stochastic(fa, b);
    case NumericsFn::kPhiloxBits:
      return philox_random_bits(b, kPhiloxTestOffset, a);
    case NumericsFn::kSwizzleOffset:
      return static_cast<uint32_t>(swizzled_scale_offset(a, b, kSwizzleTestCols));
    case NumericsFn::kExp:
      return f32_to_bits(exp_f32(fa));
    case NumericsFn::kSigmoid:
      return f32_to_bits(sigmoid_f32(fa));
    case NumericsFn::kRcpFromOne:
      return f32_to_bits(rcp_rn_from_one(fa));
    case NumericsFn::kCount:
      break;
  }
  return 0xDEADBEEFu;
}

struct NumericsCase {
  NumericsFn fn;
  std::string name;
  std::vector<uint32_t> a, b;
};

// Every case set, generated from `seed` for the random part (special and exhaustive parts are
// fixed). The same seed gives the same sets on host and device runs.
std::vector<NumericsCase> make_numerics_cases(uint64_t seed);

// A fresh seed (time and random_device), printed by the caller so failures can be replayed;
// SFMOE_TEST_SEED in the environment overrides it.
uint64_t fresh_test_seed();

// One fresh seed for the whole test program, printed the first time it is asked for.
uint64_t session_test_seed();

// FP32 values every encoder must see: +-0, subnormals, the smallest and largest normals, Inf,
// NaNs with several payloads and both signs, powers of two across the range.
std::vector<uint32_t> special_f32_bits();

}  // namespace testing
}  // namespace sfmoe

#include "tests/cpp/numerics_reference.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

namespace sfmoe {
namespace testing {
namespace {

float as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t as_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Round a double to FP32, nearest even, with IEEE overflow to Inf. (The cast alone is undefined
// behaviour for out-of-range values in C++.)
float round_to_float(double d) {
  if (std::isnan(d)) return NAN;
  const double overflow = std::ldexp(2.0 - std::ldexp(1.0, -24), 127);  // FLT_MAX + half ulp
  if (d >= overflow) return INFINITY;
  if (d <= -overflow) return -INFINITY;
  return static_cast<float>(d);
}

// A narrow format described the way its specification does.
struct RefFormat {
  int exponent_bits, mantissa_bits, bias;
  enum class Specials { kIeee, kE4M3FN, kNone } specials;
  bool saturate;
  uint32_t nan_code;

  int magnitude_bits() const { return exponent_bits + mantissa_bits; }
  bool is_nan(uint32_t magnitude) const {
    const uint32_t top = (1u << exponent_bits) - 1u;
    switch (specials) {
      case Specials::kIeee:
        return (magnitude >> mantissa_bits) == top &&
               (magnitude & ((1u << mantissa_bits) - 1u)) != 0;
      case Specials::kE4M3FN:
        return magnitude == (1u << magnitude_bits()) - 1u;
      case Specials::kNone:
        return false;
    }
    return false;
  }
  bool is_inf(uint32_t magnitude) const {
    return specials == Specials::kIeee && magnitude == ((1u << exponent_bits) - 1u)
                                                           << mantissa_bits;
  }
  // (-1)^s 2^(e - bias) (1 + m / 2^M), or 2^(1 - bias) (m / 2^M) for e = 0.
  double value(uint32_t magnitude) const {
    const uint32_t e = magnitude >> mantissa_bits;
    const double m = static_cast<double>(magnitude & ((1u << mantissa_bits) - 1u)) /
                     std::ldexp(1.0, mantissa_bits);
    return e == 0 ? std::ldexp(m, 1 - bias) : std::ldexp(1.0 + m, static_cast<int>(e) - bias);
  }
};

const RefFormat kRefE4M3{4, 3, 7, RefFormat::Specials::kE4M3FN, true, 0x7F};
const RefFormat kRefE5M2{5, 2, 15, RefFormat::Specials::kIeee, true, 0x7F};
const RefFormat kRefE2M1{2, 1, 1, RefFormat::Specials::kNone, true, 0x7};
const RefFormat kRefFP16{5, 10, 15, RefFormat::Specials::kIeee, false, 0x7FFF};
const RefFormat kRefBF16{8, 7, 127, RefFormat::Specials::kIeee, false, 0x7FFF};

struct ValueTable {
  std::vector<double> values;  // finite non-negative values, ascending; index = magnitude code
  uint32_t inf_code = 0;
};

const ValueTable& table_for(const RefFormat& f) {
  static std::vector<std::pair<const RefFormat*, ValueTable>> cache;
  for (auto& entry : cache)
    if (entry.first == &f) return entry.second;
  ValueTable t;
  for (uint32_t c = 0; c < (1u << f.magnitude_bits()); ++c) {
    if (f.is_nan(c)) continue;
    if (f.is_inf(c)) {
      t.inf_code = c;
      continue;
    }
    t.values.push_back(f.value(c));
  }
  cache.emplace_back(&f, t);
  return cache.back().second;
}

uint32_t ref_encode(const RefFormat& f, float x) {
  const ValueTable& t = table_for(f);
  if (std::isnan(x)) return f.nan_code;
  const uint32_t sign = std::signbit(x) ? (1u << f.magnitude_bits()) : 0u;
  const double a = std::fabs(static_cast<double>(x));
  const uint32_t max_code = static_cast<uint32_t>(t.values.size() - 1);
  const double max_value = t.values.back();
  if (std::isinf(a)) return sign | (f.saturate ? max_code : t.inf_code);
  if (a > max_value) {
    if (f.saturate) return sign | max_code;
    const double ulp = max_value - t.values[t.values.size() - 2];
    return sign | (a >= max_value + ulp / 2 ? t.inf_code : max_code);  // tie: max is odd
  }
  const auto it = std::lower_bound(t.values.begin(), t.values.end(), a);
  const uint32_t hi = static_cast<uint32_t>(it - t.values.begin());
  if (t.values[hi] == a || hi == 0) return sign | hi;
  const uint32_t lo = hi - 1;
  const double d_lo = a - t.values[lo], d_hi = t.values[hi] - a;
  if (d_lo < d_hi) return sign | lo;
  if (d_hi < d_lo) return sign | hi;
  return sign | ((lo & 1u) == 0 ? lo : hi);
}

float ref_decode(const RefFormat& f, uint32_t code) {
  const uint32_t magnitude = code & ((1u << f.magnitude_bits()) - 1u);
  const bool negative = (code >> f.magnitude_bits()) & 1u;
  if (f.is_nan(magnitude)) return NAN;
  if (f.is_inf(magnitude)) return negative ? -INFINITY : INFINITY;
  const double v = f.value(magnitude);
  return static_cast<float>(negative ? -v : v);
}

// Smallest power of two >= |x| as a biased exponent in [0, 254]; NaN 255, Inf 254.
uint32_t ref_e8m0(float x) {
  const double a = std::fabs(static_cast<double>(x));
  if (std::isnan(a)) return 255;
  if (std::isinf(a)) return 254;
  if (a == 0.0) return 0;
  int e;
  const double fraction = std::frexp(a, &e);  // a = fraction * 2^e, fraction in [0.5, 1)
  const int k = fraction == 0.5 ? e - 1 : e;  // 2^k >= a, smallest
  return static_cast<uint32_t>(std::clamp(k + 127, 0, 254));
}

float ref_fp8_scale(float amax, double fp8_max, bool power_of_two) {
  float scale = 1.0f;
  if (amax > 0.0f && !std::isinf(amax)) {
    scale = round_to_float(fp8_max / static_cast<double>(amax));
    if (std::isinf(scale)) scale = FLT_MAX;
  }
  if (power_of_two) {
    int e;
    std::frexp(static_cast<double>(scale), &e);
    scale = static_cast<float>(std::ldexp(1.0, e - 1));
  }
  return scale;
}

float ref_min_flt_max(double v) {  // minNum(v, FLT_MAX) after rounding v to FP32
  const float f = round_to_float(v);
  if (std::isnan(f)) return FLT_MAX;
  return std::min(f, FLT_MAX);
}

float ref_nvfp4_global(float amax) {
  if (amax == 0.0f) return 1.0f;
  const float encode = ref_min_flt_max(2688.0 / static_cast<double>(amax));
  return encode == 0.0f ? 1.0f : encode;
}

const float kOneSixth = static_cast<float>(1.0 / 6.0);

uint32_t ref_e2m1_stochastic(float x, uint32_t random_bits) {
  if (std::isnan(x) || std::isinf(x)) return ref_encode(kRefE2M1, x);
  const uint32_t sign = std::signbit(x) ? 0x8u : 0u;
  const double a = std::fabs(static_cast<double>(x));
  const std::vector<double>& v = table_for(kRefE2M1).values;
  if (a >= v.back()) return sign | 0x7u;
  const auto it = std::upper_bound(v.begin(), v.end(), a);
  const uint32_t hi = static_cast<uint32_t>(it - v.begin());
  const uint32_t lo = hi - 1;
  const double fraction = (a - v[lo]) / (v[hi] - v[lo]);
  const double threshold = std::floor(std::ldexp(fraction, 32));
  return sign | (static_cast<double>(random_bits) < threshold ? hi : lo);
}

}  // namespace

bool reference_numerics(NumericsFn fn, uint32_t a, uint32_t b, uint32_t* r) {
  const float fa = as_float(a), fb = as_float(b);
  switch (fn) {
    case NumericsFn::kE4M3Encode:
      *r = ref_encode(kRefE4M3, fa);
      return true;
    case NumericsFn::kE5M2Encode:
      *r = ref_encode(kRefE5M2, fa);
      return true;
    case NumericsFn::kE2M1Encode:
      *r = ref_encode(kRefE2M1, fa);
      return true;
    case NumericsFn::kBf16Encode:
      *r = ref_encode(kRefBF16, fa);
      return true;
    case NumericsFn::kFp16Encode:
      *r = ref_encode(kRefFP16, fa);
      return true;
    case NumericsFn::kE4M3Decode:
      *r = as_bits(ref_decode(kRefE4M3, a));
      return true;
    case NumericsFn::kE5M2Decode:
      *r = as_bits(ref_decode(kRefE5M2, a));
      return true;
    case NumericsFn::kE2M1Decode:
      *r = as_bits(ref_decode(kRefE2M1, a));
      return true;
    case NumericsFn::kBf16Decode:
      *r = as_bits(ref_decode(kRefBF16, a));
      return true;
    case NumericsFn::kFp16Decode:
      *r = as_bits(ref_decode(kRefFP16, a));
      return true;
    case NumericsFn::kE8M0Encode:
      *r = ref_e8m0(fa);
      return true;
    case NumericsFn::kE8M0Decode:
      *r = as_bits(a == 255 ? NAN : static_cast<float>(std::ldexp(1.0, static_cast<int>(a) - 127)));
      return true;
    case NumericsFn::kMxMultiplier:
      // 2^(127 - e) where FP32 holds it as a normal number; 0 below; NaN for 255.
      *r = as_bits(
          a == 255
              ? NAN
              : (a == 254 ? 0.0f : static_cast<float>(std::ldexp(1.0, 127 - static_cast<int>(a)))));
      return true;
    case NumericsFn::kMxScaleE4M3:
    case NumericsFn::kMxScaleE5M2: {
      const double max = fn == NumericsFn::kMxScaleE4M3 ? 448.0 : 57344.0;
      const float reciprocal = static_cast<float>(1.0 / max);
      *r = ref_e8m0(round_to_float(static_cast<double>(fa) * reciprocal));
      return true;
    }
    case NumericsFn::kFp8ScaleE4M3:
      *r = as_bits(ref_fp8_scale(fa, 448.0, false));
      return true;
    case NumericsFn::kFp8ScaleE4M3Pow2:
      *r = as_bits(ref_fp8_scale(fa, 448.0, true));
      return true;
    case NumericsFn::kFp8ScaleE5M2:
      *r = as_bits(ref_fp8_scale(fa, 57344.0, false));
      return true;
    case NumericsFn::kScaleInverse:
      *r = as_bits(round_to_float(1.0 / static_cast<double>(fa)));
      return true;
    case NumericsFn::kNvfp4GlobalScale:
      *r = as_bits(ref_nvfp4_global(fa));
      return true;
    case NumericsFn::kNvfp4BlockScale: {
      const float t = round_to_float(static_cast<double>(fb) * kOneSixth);
      *r = ref_encode(kRefE4M3, round_to_float(static_cast<double>(fa) * t));
      return true;
    }
    case NumericsFn::kNvfp4BlockMultiplier: {
      const float global_decode = round_to_float(1.0 / static_cast<double>(fb));
      const float block_decode =
          round_to_float(static_cast<double>(ref_decode(kRefE4M3, a)) * global_decode);
      *r = as_bits(ref_min_flt_max(1.0 / static_cast<double>(block_decode)));
      return true;
    }
    case NumericsFn::kE2M1Stochastic:
      *r = ref_e2m1_stochastic(fa, b);
      return true;
    case NumericsFn::kRcpFromOne: {
      // The float nearest 1 / a: of the neighbours of the double quotient's rounding, the one
      // with the least |1 - a c| (exact in double: a c has at most 48 significant bits).
      const float guess = static_cast<float>(1.0 / static_cast<double>(fa));
      float best = guess;
      for (float c : {std::nextafter(guess, 0.0f), std::nextafter(guess, 1.0f)}) {
        if (std::fabs(1.0 - static_cast<double>(fa) * c) <
            std::fabs(1.0 - static_cast<double>(fa) * best))
          best = c;
      }
      *r = numerics::f32_to_bits(best);
      return true;
    }
    case NumericsFn::kSwizzleOffset: {
      // DESIGN.md section 4, read literally: 128x4 tiles in row-major tile order, 512 entries
      // each; inside, (i % 32) * 16 + (i / 32) * 4 + j for tile-local row i and column j.
      const int64_t tiles_per_row = (kSwizzleTestCols + 3) / 4;
      const int64_t i = a % 128, j = b % 4;
      *r = static_cast<uint32_t>(((a / 128) * tiles_per_row + b / 4) * 512 + (i % 32) * 16 +
                                 (i / 32) * 4 + j);
      return true;
    }
    default:
      return false;
  }
}

bool same_result(NumericsFn fn, uint32_t x, uint32_t y) {
  if (x == y) return true;
  switch (fn) {
    case NumericsFn::kE4M3Decode:
    case NumericsFn::kE5M2Decode:
    case NumericsFn::kE2M1Decode:
    case NumericsFn::kBf16Decode:
    case NumericsFn::kFp16Decode:
    case NumericsFn::kE8M0Decode:
    case NumericsFn::kMxMultiplier:
    case NumericsFn::kScaleInverse:
      return std::isnan(as_float(x)) && std::isnan(as_float(y));
    default:
      return false;
  }
}

}  // namespace testing
}  // namespace sfmoe

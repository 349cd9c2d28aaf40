// Reading any floating-point dtype as FP32 and writing FP32 into any floating-point dtype, by
// element index, on host or device. The conversions are the numerics headers' own.
#pragma once

#include "sfmoe/numerics/float_formats.h"
#include "sfmoe/sfmoe.h"

namespace sfmoe {

SFMOE_HD bool is_float_dtype(sfmoe_dtype dtype) {
  return dtype == SFMOE_DTYPE_FP32 || dtype == SFMOE_DTYPE_BF16 || dtype == SFMOE_DTYPE_FP16 ||
         dtype == SFMOE_DTYPE_FP8_E4M3 || dtype == SFMOE_DTYPE_FP8_E5M2 ||
         dtype == SFMOE_DTYPE_FP4_E2M1;
}

// Decodes an element code (as stored, zero-extended) of a floating-point dtype.
SFMOE_HD float decode_element(sfmoe_dtype dtype, uint32_t code) {
  using namespace numerics;
  switch (dtype) {
    case SFMOE_DTYPE_FP32:
      return bits_to_f32(code);
    case SFMOE_DTYPE_BF16:
      return bf16_to_f32(static_cast<uint16_t>(code));
    case SFMOE_DTYPE_FP16:
      return fp16_to_f32(static_cast<uint16_t>(code));
    case SFMOE_DTYPE_FP8_E4M3:
      return e4m3_to_f32(static_cast<uint8_t>(code));
    case SFMOE_DTYPE_FP8_E5M2:
      return e5m2_to_f32(static_cast<uint8_t>(code));
    case SFMOE_DTYPE_FP4_E2M1:
      return e2m1_to_f32(static_cast<uint8_t>(code));
    default:
      return bits_to_f32(kF32CanonicalNanBits);
  }
}

SFMOE_HD uint32_t encode_element(sfmoe_dtype dtype, float value) {
  using namespace numerics;
  switch (dtype) {
    case SFMOE_DTYPE_FP32:
      return f32_to_bits(value);
    case SFMOE_DTYPE_BF16:
      return f32_to_bf16(value);
    case SFMOE_DTYPE_FP16:
      return f32_to_fp16(value);
    case SFMOE_DTYPE_FP8_E4M3:
      return f32_to_e4m3(value);
    case SFMOE_DTYPE_FP8_E5M2:
      return f32_to_e5m2(value);
    case SFMOE_DTYPE_FP4_E2M1:
      return f32_to_e2m1(value);
    default:
      return 0;
  }
}

// Element i's code from a packed buffer of `bits`-wide elements (4, 8, 16 or 32).
SFMOE_HD uint32_t load_code(const void* data, int bits, int64_t i) {
  switch (bits) {
    case 32:
      return static_cast<const uint32_t*>(data)[i];
    case 16:
      return static_cast<const uint16_t*>(data)[i];
    case 8:
      return static_cast<const uint8_t*>(data)[i];
    default:
      return (static_cast<const uint8_t*>(data)[i >> 1] >> ((i & 1) * 4)) & 0xFu;
  }
}

}  // namespace sfmoe

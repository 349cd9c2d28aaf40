// Element i of a buffer of a byte-sized float dtype (FP32, BF16, FP16, FP8), read as FP32 or
// written from FP32 with the numerics encoders: the CPU references' plain loops use these.
#pragma once

#include <string.h>

#include "src/common/element_codec.h"

namespace sfmoe {
namespace cpu {

inline float load_value(const void* data, sfmoe_dtype dtype, int64_t index) {
  return decode_element(dtype, load_code(data, sfmoe_dtype_bits(dtype), index));
}

inline void store_value(void* data, sfmoe_dtype dtype, int64_t index, float value) {
  const uint32_t code = encode_element(dtype, value);
  const int64_t bytes = sfmoe_dtype_bits(dtype) / 8;
  memcpy(static_cast<uint8_t*>(data) + index * bytes, &code,
         static_cast<size_t>(bytes));  // little endian
}

}  // namespace cpu
}  // namespace sfmoe

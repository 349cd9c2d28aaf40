#include "src/common/element_codec.h"
#include "src/cpu/backend.h"

namespace sfmoe {
namespace cpu {

void cast(const void* input, sfmoe_dtype input_dtype, void* output, sfmoe_dtype output_dtype,
          int64_t count, float scale) {
  const int in_bits = sfmoe_dtype_bits(input_dtype);
  const int out_bits = sfmoe_dtype_bits(output_dtype);
  for (int64_t i = 0; i < count; ++i) {
    const float value = decode_element(input_dtype, load_code(input, in_bits, i));
    const uint32_t code = encode_element(output_dtype, numerics::mul_rn(value, scale));
    switch (out_bits) {
      case 32:
        static_cast<uint32_t*>(output)[i] = code;
        break;
      case 16:
        static_cast<uint16_t*>(output)[i] = static_cast<uint16_t>(code);
        break;
      case 8:
        static_cast<uint8_t*>(output)[i] = static_cast<uint8_t>(code);
        break;
      default: {
        uint8_t& byte = static_cast<uint8_t*>(output)[i >> 1];
        const int shift = (i & 1) * 4;
        byte = static_cast<uint8_t>((byte & ~(0xF << shift)) | ((code & 0xF) << shift));
      }
    }
  }
}

}  // namespace cpu
}  // namespace sfmoe

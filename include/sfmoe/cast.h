/* Elementwise scaled conversion between the floating-point dtypes:
 *   output[i] = encode_out(decode_in(input[i]) * scale)      (one FP32 multiply, RN)
 * With an FP8 / FP4 output this is per-tensor quantization with a given scale; with an FP8 / FP4
 * input and scale = scale_inv it is dequantization. Encoding follows include/sfmoe/numerics/
 * (round to nearest even; FP8/FP4 saturate to the finite maximum; NaN handling per
 * docs/numerics.md), so the CPU and CUDA backends agree bit for bit.
 */
#ifndef SFMOE_CAST_H_
#define SFMOE_CAST_H_

#include "sfmoe/sfmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sfmoe_cast_config {
  size_t struct_size;
  float scale;               /* multiplier applied before encoding; 1 for a plain cast */
  const float* scale_device; /* if not NULL: read the multiplier here (same memory as the
                                tensors) at run time, so a scale computed on the device feeds
                                the cast without a host round trip; `scale` is then ignored */
} sfmoe_cast_config;

SFMOE_API sfmoe_cast_config sfmoe_cast_config_init(void);

/* input and output: same number of elements, same memory space; dtypes among FP32, BF16, FP16,
 * FP8_E4M3, FP8_E5M2, FP4_E2M1 (an FP4 tensor needs an even innermost dimension). */
SFMOE_API sfmoe_status sfmoe_cast(const sfmoe_tensor* input, const sfmoe_tensor* output,
                                  const sfmoe_cast_config* config, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SFMOE_CAST_H_ */

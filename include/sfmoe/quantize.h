/* Grouped quantization: per-group amax, quantization of a high-precision grouped tensor into
 * every recipe (FP8 per-tensor, FP8 blockwise 1x128 / 128x128, MXFP8, NVFP4 1x16 / 16x16) with
 * rowwise and columnwise (transposed) copies, dequantization, and the scale swizzle.
 * The rules (padding, block placement, scale storage, NaN/Inf behaviour) are in
 * docs/quantization.md; the numerics in include/sfmoe/numerics/.
 */
#ifndef SFMOE_QUANTIZE_H_
#define SFMOE_QUANTIZE_H_

#include "sfmoe/sfmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sfmoe_quantize_config {
  size_t struct_size;
  int32_t power_of_two_scales; /* FP8 tensor / blockwise: round scales down to powers of two */
  int32_t stochastic_rounding; /* NVFP4: stochastic rounding from the Philox stream below */
  uint64_t seed;               /* Philox key */
  uint64_t offset;             /* Philox stream offset (advance it per step) */
  int32_t hadamard_columnwise; /* NVFP4 1x16: random Hadamard transform on the columnwise copy */
  int32_t trap_nan_amax;       /* raise SFMOE_FAULT_NAN_AMAX when an amax is NaN */
  /* FP8 per-tensor (TENSOR): each group's scale given by the caller (delayed scaling, e.g. from
   * an amax history), [num_groups] FP32 in the output's memory, used as is (power_of_two_scales
   * does not apply); the group amax is still computed and written. NULL: current scaling, each
   * group's scale from its own amax. Lets permute and the activations quantize TENSOR outputs in
   * their single pass. */
  const float* tensor_scales;
  /* FP8 per-tensor current scaling (TENSOR without tensor_scales) and NVFP4: each group's amax
   * given by the caller (e.g. folded by the op that produced the rows, or a bound known in
   * advance), [num_groups] FP32 in the output's memory. The scales follow from it by the
   * recipe's rules, so the input is read once instead of twice (amax, then codes); output->amax
   * receives a copy. Values beyond it saturate: FP8 codes at the format's largest finite value,
   * NVFP4 block scales at E4M3's 448 and codes at 6. Not with tensor_scales, nor with NVFP4's
   * Hadamard-transformed columnwise copy (whose amax is that of the transformed values). NULL:
   * the amax is computed from the input. */
  const float* group_amax;
} sfmoe_quantize_config;

SFMOE_API sfmoe_quantize_config sfmoe_quantize_config_init(void);

/* amax[g] = max |x| over the rows of group g (NaN if any of them is NaN; 0 for an empty group).
 * `amax` has num_groups floats in the tensor's memory. `word` may be NULL. */
SFMOE_API sfmoe_status sfmoe_grouped_amax(const sfmoe_grouped_tensor* input, float* amax,
                                          sfmoe_status_word* word, void* stream);

/* Quantizes `input` (FP32 / BF16 / FP16, scaling NONE) into `output`, whose dtype and scaling
 * select the recipe and whose non-NULL rowwise_data / columnwise_data select the copies. Writes
 * output->group_offsets (the padded offsets), the data, the scales and, where the recipe has one,
 * the amax. `word` may be NULL. */
SFMOE_API sfmoe_status sfmoe_grouped_quantize(const sfmoe_grouped_tensor* input,
                                              const sfmoe_grouped_tensor* output,
                                              const sfmoe_quantize_config* config,
                                              sfmoe_status_word* word, void* stream);

typedef enum sfmoe_dequantize_source {
  SFMOE_DEQUANTIZE_AUTO = 0, /* the rowwise copy if present, else the columnwise one */
  SFMOE_DEQUANTIZE_ROWWISE = 1,
  SFMOE_DEQUANTIZE_COLUMNWISE = 2 /* transposed back (and the Hadamard transform undone) */
} sfmoe_dequantize_source;

/* Decodes a quantized grouped tensor into `output` (FP32 / BF16 / FP16, scaling NONE, same
 * row_capacity and cols), in the rowwise orientation, rows [0, group_offsets[num_groups]).
 * `config` is the one the tensor was quantized with (it says whether the columnwise copy carries
 * the Hadamard transform); NULL means the defaults. */
SFMOE_API sfmoe_status sfmoe_grouped_dequantize(const sfmoe_grouped_tensor* input,
                                                const sfmoe_grouped_tensor* output,
                                                sfmoe_dequantize_source source,
                                                const sfmoe_quantize_config* config, void* stream);

/* Compact [rows, scale_cols] byte scales (E8M0 or E4M3) <-> the swizzled tensor-core layout of
 * swizzled_scale_padded_size(rows, scale_cols) bytes; swizzle writes the padding entries as 0.
 * Both tensors are 1-D or 2-D byte tensors (dtype E8M0 or FP8_E4M3) in the same memory. */
SFMOE_API sfmoe_status sfmoe_swizzle_scales(const sfmoe_tensor* compact, int64_t rows,
                                            int64_t scale_cols, const sfmoe_tensor* swizzled,
                                            void* stream);
SFMOE_API sfmoe_status sfmoe_unswizzle_scales(const sfmoe_tensor* swizzled, int64_t rows,
                                              int64_t scale_cols, const sfmoe_tensor* compact,
                                              void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SFMOE_QUANTIZE_H_ */

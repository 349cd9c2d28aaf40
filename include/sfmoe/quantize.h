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
  /* NVFP4 stochastic rounding: NULL, or one uint64 in the output's memory added to `offset` when
   * the kernel runs. It is read on the device, so a captured CUDA graph or a compiled XLA step
   * whose caller advances it between runs rounds with a new stream each time without being
   * captured again (a host `offset` is fixed at capture). 8-byte aligned. */
  const uint64_t* offset_device;
} sfmoe_quantize_config;

SFMOE_API sfmoe_quantize_config sfmoe_quantize_config_init(void);

/* ---- planning a quantize output (sfmoe.h, "layout planning") ---- */
typedef struct sfmoe_quantize_plan_request {
  size_t struct_size;
  sfmoe_dtype dtype;     /* of the codes: FP8_E4M3 or FP8_E5M2 (FP8 recipes), FP4_E2M1 (NVFP4) */
  sfmoe_scaling scaling; /* any but NONE */
  sfmoe_scale_layout scale_layout;
  int32_t rowwise, columnwise; /* the copies (at least one) */
  int32_t hadamard_columnwise; /* NVFP4 1x16 with a columnwise copy: plans its columnwise_amax */
  int64_t num_groups;
  int64_t cols;
  /* The input's row bound: its row_capacity (uniform groups: num_groups * uniform_group_rows). */
  int64_t input_rows;
  /* The input's groups already start at multiples of this (its row_alignment): an output
   * row_alignment dividing it needs no padding rows. 0 or 1 promises nothing. */
  int64_t input_row_alignment;
  int64_t uniform_group_rows; /* > 0: uniform groups of this many rows (no offsets, no padding) */
  int64_t row_alignment;      /* a power of two; 0: the recipe's sfmoe_min_row_alignment */
  /* 0: the default, the smallest capacity the op accepts (input rows plus each group's alignment
   * padding, in whole blocks where blocks run down the rows, a multiple of row_alignment with a
   * columnwise copy, even for FP4), rounded up to a multiple of 1024 rows for a compact
   * columnwise MX_1X32 / BLOCK_1X128 copy of 16384 rows or more (those scales are then written in
   * whole 32-byte sectors, docs/quantization.md). > 0: this capacity, checked against the same
   * rules. */
  int64_t row_capacity;
} sfmoe_quantize_plan_request;

/* A request with struct_size set, dtype FP8_E4M3, rowwise on and everything else zero. */
SFMOE_API sfmoe_quantize_plan_request sfmoe_quantize_plan_request_init(void);

/* Every buffer of the output sfmoe_grouped_quantize writes for such an input: the descriptor
 * fields and buffers of `plan` (struct_size set by the caller) are what the op accepts. Fails,
 * writing nothing, on a request the op would refuse (unknown enums, a layout or copy the recipe
 * does not have, cols not a multiple of the block, a capacity too small or misaligned, sizes
 * beyond int64). */
SFMOE_API sfmoe_status sfmoe_plan_grouped_quantize(const sfmoe_quantize_plan_request* request,
                                                   sfmoe_grouped_tensor_plan* plan);

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

typedef enum sfmoe_dequantize_source SFMOE_ENUM_INT32 {
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

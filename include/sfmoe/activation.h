/* Grouped activations between the two grouped GEMMs of an MoE FFN, forward and backward: SwiGLU,
 * GeGLU, SiLU, GELU (tanh form), squared ReLU, and the clamped SwiGLU. Gated kinds read
 * [gate | up] (W1 = [W_gate; W_up]). Only each group's real rows are computed; its alignment
 * padding is written as zeros. The rules are in docs/activations.md.
 *
 * Backends: the CPU reference on host memory, CUDA kernels on device memory (the same bits,
 * sync-free: the offsets and row counts are read on the device, the work follows the real rows).
 * On the host, bad offsets or row counts are refused before anything is written; on the device
 * the kernels clamp them and report to `word` (may be NULL): SFMOE_FAULT_BAD_GROUP_OFFSETS /
 * SFMOE_FAULT_GROUP_OVER_CAPACITY.
 */
#ifndef SFMOE_ACTIVATION_H_
#define SFMOE_ACTIVATION_H_

#include "sfmoe/quantize.h"
#include "sfmoe/sfmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sfmoe_activation SFMOE_ENUM_INT32 {
  SFMOE_ACTIVATION_SWIGLU = 0,        /* silu(gate) * up */
  SFMOE_ACTIVATION_GEGLU = 1,         /* gelu_tanh(gate) * up */
  SFMOE_ACTIVATION_SILU = 2,          /* x * sigmoid(x) */
  SFMOE_ACTIVATION_GELU = 3,          /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  SFMOE_ACTIVATION_SQUARED_RELU = 4,  /* max(x, 0)^2 */
  SFMOE_ACTIVATION_CLAMPED_SWIGLU = 5 /* g sigmoid(alpha g) (u + 1), g = min(gate, limit),
                                         u = clamp(up, -limit, limit) */
} sfmoe_activation;

typedef struct sfmoe_activation_config {
  size_t struct_size;
  sfmoe_activation kind;
  float limit;                                  /* clamped SwiGLU (7) */
  float alpha;                                  /* clamped SwiGLU (1.702) */
  const struct sfmoe_quantize_config* quantize; /* options of a fused output quantization (only
                                                   power_of_two_scales applies), or NULL */
} sfmoe_activation_config;

SFMOE_API sfmoe_activation_config sfmoe_activation_config_init(void);

/* ---- planning the output (sfmoe.h, "layout planning") ---- */
typedef struct sfmoe_activation_plan_request {
  size_t struct_size;
  sfmoe_activation kind;
  /* The input's: num_groups, row_capacity, cols (2F for the gated kinds) and row_alignment. */
  int64_t num_groups, row_capacity, input_cols, row_alignment;
  /* The output: FP32 / BF16 / FP16 with SFMOE_SCALING_NONE, or a fused quantization's codes,
   * scaling and scale layout (rowwise copy only). */
  sfmoe_dtype dtype;
  sfmoe_scaling scaling;
  sfmoe_scale_layout scale_layout;
  int32_t group_amax; /* plan output.amax (each group's amax); always planned where the recipe
                         needs it (TENSOR, NV_1X16) */
} sfmoe_activation_plan_request;

/* A request with struct_size set, kind SwiGLU, row_alignment 1, dtype BF16, the rest zero. */
SFMOE_API sfmoe_activation_plan_request sfmoe_activation_plan_request_init(void);
/* Every buffer of the output sfmoe_grouped_activation writes (its group_offsets receive the
 * input's, or may be the input's own array). Fails, writing nothing, on a request the op would
 * refuse. */
SFMOE_API sfmoe_status sfmoe_plan_grouped_activation(const sfmoe_activation_plan_request* request,
                                                     sfmoe_grouped_tensor_plan* plan);

/* input: grouped [row_capacity, 2F] for the gated kinds, [row_capacity, F] otherwise (FP32, BF16
 * or FP16); group_rows [num_groups] INT64: each group's real rows (e.g. tokens_per_expert), at
 * most its block. output: grouped [row_capacity, F], same groups and capacity; its group_offsets
 * receive the input's (or are the same pointer). The output is FP32, BF16 or FP16 values, or
 * quantized on the fly (FP8 with rowwise MX_1X32 or BLOCK_1X128 scales, FP8 TENSOR with given
 * scales in config->quantize->tensor_scales, or NVFP4 NV_1X16 with its amax; rowwise copy only,
 * F a multiple of the block): the same bytes as sfmoe_grouped_quantize of the FP32 activations
 * with these offsets. NVFP4 takes two passes over the input (the group amax its global scales
 * come from, then the codes). output->amax, when not NULL, receives each group's amax of the FP32
 * activations (propagating NaN; 0 for an empty group), e.g. for a per-tensor scale. */
SFMOE_API sfmoe_status sfmoe_grouped_activation(const sfmoe_grouped_tensor* input,
                                                const sfmoe_tensor* group_rows,
                                                const sfmoe_activation_config* config,
                                                const sfmoe_grouped_tensor* output,
                                                sfmoe_status_word* word, void* stream);

/* d_input (shaped like input, every row of each group written: padding rows zero) from the
 * forward's input and d_output. */
SFMOE_API sfmoe_status sfmoe_grouped_activation_backward(const sfmoe_grouped_tensor* input,
                                                         const sfmoe_tensor* group_rows,
                                                         const sfmoe_grouped_tensor* d_output,
                                                         const sfmoe_activation_config* config,
                                                         const sfmoe_grouped_tensor* d_input,
                                                         sfmoe_status_word* word, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SFMOE_ACTIVATION_H_ */

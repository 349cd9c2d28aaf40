/* Permute (token rows -> expert-sorted rows, each expert's block padded with zero rows) and
 * unpermute (expert rows -> token rows, weighted by the router's probabilities, deterministic),
 * with their backward. The rules are in docs/permute.md.
 *
 * Backends: the CPU reference on host memory, CUDA kernels on device memory (the same bits; up
 * to 64 slots per token there; sync-free: ids, row maps and offsets are never read by the host).
 * On the host, bad ids and row maps are refused before anything is written; on the device the
 * kernels skip the bad entries and raise SFMOE_FAULT_BAD_INDEX in `word` (may be NULL).
 */
#ifndef SFMOE_PERMUTE_H_
#define SFMOE_PERMUTE_H_

#include "sfmoe/quantize.h"
#include "sfmoe/sfmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sfmoe_permute_config {
  size_t struct_size;
  int64_t expert_capacity; /* > 0: an expert keeps at most this many tokens (the lowest token
                              indices); 0: no limit */
  const struct sfmoe_quantize_config* quantize; /* options of a fused quantization (only
                                                   power_of_two_scales applies), or NULL */
} sfmoe_permute_config;

SFMOE_API sfmoe_permute_config sfmoe_permute_config_init(void);

/* ---- planning (sfmoe.h, "layout planning") ---- */
typedef struct sfmoe_permute_plan_request {
  size_t struct_size;
  int64_t num_tokens, topk, num_experts, hidden;
  int64_t row_alignment;   /* 1, 8, 16, 32, 64 or 128 */
  int64_t expert_capacity; /* as in sfmoe_permute_config */
  /* The permuted rows: the tokens' dtype with SFMOE_SCALING_NONE, or a fused quantization's
   * codes, scaling and scale layout (rowwise copy only). */
  sfmoe_dtype dtype;
  sfmoe_scaling scaling;
  sfmoe_scale_layout scale_layout;
  int32_t group_amax; /* unquantized rows: plan permuted.amax (each expert's amax) */
} sfmoe_permute_plan_request;

typedef struct sfmoe_permute_plan {
  size_t struct_size;
  sfmoe_grouped_tensor_plan permuted;   /* E groups, row_capacity the worst case */
  sfmoe_buffer_plan row_map;            /* INT64 [T, k] */
  sfmoe_buffer_plan tokens_per_expert;  /* INT64 [E] */
  sfmoe_buffer_plan dropped_per_expert; /* INT64 [E] */
  sfmoe_buffer_plan workspace;          /* the device's workspace (bytes; ignored on the host) */
} sfmoe_permute_plan;

/* A request with struct_size set, row_alignment 1, dtype BF16 and everything else zero. */
SFMOE_API sfmoe_permute_plan_request sfmoe_permute_plan_request_init(void);
/* Every buffer sfmoe_permute writes or needs for such inputs. Fails, writing nothing, on a
 * request the op would refuse. */
SFMOE_API sfmoe_status sfmoe_plan_permute(const sfmoe_permute_plan_request* request,
                                          sfmoe_permute_plan* plan);
/* Bytes of permute's device workspace (per-chunk expert counts), the plan's workspace.bytes;
 * -1 for negative sizes or no experts. Allocate it once, outside the step. */
SFMOE_API int64_t sfmoe_permute_workspace_bytes(int64_t num_tokens, int64_t num_experts);

/* tokens [T, H] FP32, BF16 or FP16; topk_ids [T, k] INT32 (each token names an expert at most
 * once; ids outside [0, E) are refused). Outputs:
 *   permuted: a grouped tensor of E groups, H cols, the tokens' dtype, scaling NONE, rowwise data
 *     only; its row_alignment (1, 8, 16, 32, 64 or 128) pads each expert's block; group_offsets
 *     (E + 1 entries) is written; row_capacity must hold the worst case,
 *     min(T k, E capacity) + E (row_alignment - 1). Or quantized rows (fused quantization): FP8
 *     with rowwise MX_1X32 or BLOCK_1X128 scales (compact, or swizzled for MX), rowwise copy
 *     only, H a multiple of the block: the same bytes as permute followed by
 *     sfmoe_grouped_quantize of the rows with these offsets. Unquantized rows: permuted->amax,
 *     when not NULL ([E] FP32), receives each expert's amax of its kept rows (NaN propagating; 0
 *     for an expert without rows), the group_amax a following current-scaling quantization of
 *     the rows can take instead of reading them twice;
 *   row_map [T, k] INT64: each slot's row, or -1 where the capacity dropped it;
 *   tokens_per_expert [E] INT64: rows kept; dropped_per_expert [E] INT64 or NULL.
 * workspace: a 1-D tensor (any dtype) of at least sfmoe_permute_workspace_bytes(T, E) bytes,
 * required on the device (up to 6144 experts there), ignored (may be NULL) on the host. */
SFMOE_API sfmoe_status sfmoe_permute(
    const sfmoe_tensor* tokens, const sfmoe_tensor* topk_ids, const sfmoe_permute_config* config,
    const sfmoe_grouped_tensor* permuted, const sfmoe_tensor* row_map,
    const sfmoe_tensor* tokens_per_expert, const sfmoe_tensor* dropped_per_expert,
    const sfmoe_tensor* workspace, sfmoe_status_word* word, void* stream);

/* out [T, H] = sum_i probs[t, i] * rows[row_map[t, i]], FP32 sums in slot order, rounded once to
 * out's dtype (FP32, BF16, FP16). probs [T, k] FP32, or NULL for weight 1: that is permute's
 * backward (d tokens from d permuted). rows: [row_capacity, H] of FP32, BF16 or FP16 (rowwise
 * data). */
SFMOE_API sfmoe_status sfmoe_unpermute(const sfmoe_grouped_tensor* rows,
                                       const sfmoe_tensor* row_map, const sfmoe_tensor* probs,
                                       const sfmoe_tensor* out, sfmoe_status_word* word,
                                       void* stream);

/* Unpermute's backward: d_rows (probs * d_out where a slot names the row; each group's padding
 * rows, after its group_rows real rows, zero; rows beyond the groups untouched) and d_probs
 * [T, k] FP32. rows carries the group offsets; group_rows [E] INT64 is permute's
 * tokens_per_expert. */
SFMOE_API sfmoe_status sfmoe_unpermute_backward(
    const sfmoe_tensor* d_out, const sfmoe_grouped_tensor* rows, const sfmoe_tensor* row_map,
    const sfmoe_tensor* probs, const sfmoe_tensor* group_rows, const sfmoe_grouped_tensor* d_rows,
    const sfmoe_tensor* d_probs, sfmoe_status_word* word, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SFMOE_PERMUTE_H_ */

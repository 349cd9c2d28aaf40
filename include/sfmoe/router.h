/* The MoE router: scores, top-k selection (optionally group-limited, with an expert bias for
 * the selection only), probabilities, tokens per expert, the load-balancing and z losses, and
 * the backward. The rules are in docs/router.md.
 *
 * Backends: the CPU reference on host memory; CUDA kernels on device memory (up to 512 experts,
 * 64 groups, top_k 64), sync-free and capturable. Both select the same experts and write the
 * same probability bits; the losses agree to rounding.
 */
#ifndef SFMOE_ROUTER_H_
#define SFMOE_ROUTER_H_

#include "sfmoe/sfmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sfmoe_router_score SFMOE_ENUM_INT32 {
  SFMOE_ROUTER_SCORE_SOFTMAX = 0,
  SFMOE_ROUTER_SCORE_SIGMOID = 1
} sfmoe_router_score;

typedef struct sfmoe_router_config {
  size_t struct_size;
  int64_t top_k; /* experts per token, 1 <= top_k <= num_experts */
  sfmoe_router_score score;
  int32_t softmax_after_topk; /* softmax only: select on the logits, softmax over the k */
  int64_t num_groups;         /* group-limited routing when > 1: it must divide num_experts */
  int64_t group_topk;         /* groups kept per token (with num_groups > 1) */
  int64_t group_score_topk;   /* a group's score: the sum of its best this-many scores (2) */
  float scaling_factor;       /* multiplies the final probabilities (1) */
  int32_t normalize;          /* divide the k probabilities by their sum (not with softmax after
                                 top-k, whose probabilities already sum to 1) */
  float aux_loss_coeff;       /* Switch/GShard load-balancing loss coefficient (0: none) */
  float z_loss_coeff;         /* z-loss coefficient (0: none) */
} sfmoe_router_config;

/* Softmax, top_k 0 (must be set), no groups, group_score_topk 2, scaling 1, no normalization,
 * no losses. */
SFMOE_API sfmoe_router_config sfmoe_router_config_init(void);

/* Bytes of the forward's workspace on the device when a loss is asked for: per-block FP32 partial
 * sums, reduced in a fixed order (no float atomics: the losses have the same bits every run).
 * Allocate it once, outside the step. -1 for negative sizes or no experts. */
SFMOE_API int64_t sfmoe_router_workspace_bytes(int64_t tokens, int64_t num_experts);

/* logits [T, E] FP32 or BF16; expert_bias [E] FP32 or NULL. Outputs: topk_ids [T, k] INT32 (best
 * first), probs [T, k] FP32, tokens_per_expert [E] INT64; aux_loss and z_loss: FP32 scalars
 * (one element) or NULL, required when their coefficient is not 0. All in one memory space.
 * workspace: a 1-D tensor (any dtype, 16-byte aligned) of at least
 * sfmoe_router_workspace_bytes(T, E) bytes, required on the device when aux_loss or z_loss is
 * given; ignored (may be NULL) on the host. */
SFMOE_API sfmoe_status sfmoe_router_forward(
    const sfmoe_tensor* logits, const sfmoe_tensor* expert_bias, const sfmoe_router_config* config,
    const sfmoe_tensor* topk_ids, const sfmoe_tensor* probs, const sfmoe_tensor* tokens_per_expert,
    const sfmoe_tensor* aux_loss, const sfmoe_tensor* z_loss, const sfmoe_tensor* workspace,
    void* stream);

/* d_logits [T, E] FP32 from the forward's logits, topk_ids and tokens_per_expert, the upstream
 * gradient of the probabilities (d_probs [T, k] FP32, or NULL for none) and of the two losses
 * (host values; usually 1, or 0 to leave a loss out). On the host, ids outside [0, E) are
 * refused before anything is written; on the device (where the host does not read them) such an
 * id takes no part and raises SFMOE_FAULT_BAD_INDEX in `word` (may be NULL). */
SFMOE_API sfmoe_status sfmoe_router_backward(
    const sfmoe_tensor* logits, const sfmoe_tensor* topk_ids, const sfmoe_tensor* tokens_per_expert,
    const sfmoe_router_config* config, const sfmoe_tensor* d_probs, float d_aux_loss,
    float d_z_loss, const sfmoe_tensor* d_logits, sfmoe_status_word* word, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SFMOE_ROUTER_H_ */

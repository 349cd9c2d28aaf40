// The MoE layer (docs/moe_layer.md): one expert-parallel-free MoE FFN, forward and backward, as a
// sequence of ops enqueued on one stream through the backend table (src/ops/backend.h), with no
// allocation, no synchronization and no validation of its own steps. The C API
// (src/api/moe_layer.cpp) validates a call once and hands this layer plain pointers.
//
// Forward:  router (top-k of the caller's logits) -> permute (expert-sorted rows, padding,
//           capacity) -> FC1 (grouped GEMM, W1 [E, 2F or F, H]) -> activation -> FC2 (grouped
//           GEMM, W2 [E, H, F]) -> unpermute (probability-weighted combine).
// Backward: d y gathered into expert rows (unweighted) -> FC2 dgrad -> the activation's
//           backward with each row's probability as its weight (the activation recomputed from
//           FC1's saved output; it also yields d probs and the weighted activations for FC2's
//           wgrad) -> FC2 wgrad -> x gathered into expert rows again -> FC1 wgrad and dgrad ->
//           permute backward (each token's k slots summed) -> router backward (d logits, the
//           loss gradients).
// Saved between the two: the routing (ids, probs, row map, offsets, counts) and FC1's output
// only; the backward overwrites FC1's output with its gradient, so one forward has one backward.
//
// Expert parallelism (ep_world > 1; docs/ep.md): the experts are split evenly over the ranks, and
// the expert-parallel moves replace permute's: the router on each rank's tokens -> dispatch (each
// token's row to its experts' ranks, grouped by local expert) -> each rank's FFN on its received
// rows and its local experts' weights -> combine (probability-weighted, back to the tokens); the
// backward moves d y and x to the experts' rows again, each row's probability there and its d prob
// back, and d x rows back to the tokens. The loopback transport holds every rank in this process:
// the calls take one argument set per rank (moe_layer_forward_ranks).
#pragma once

#include <stdint.h>

#include <vector>

#include "sfmoe/sfmoe.h"
#include "src/common/activation_args.h"
#include "src/common/outcome.h"
#include "src/common/router_args.h"
#include "src/layer/layer_recipe.h"
#include "src/ops/ep_stages.h"
#include "src/ops/layout_plan.h"

namespace sfmoe {
namespace layer {

// What the layer is created from: host-known bounds and options.
struct MoeLayerShape {
  int64_t hidden = 0;           // H
  int64_t ffn = 0;              // F
  int64_t experts = 0;          // E
  int64_t top_k = 0;            // k
  int64_t max_tokens = 0;       // every call's T is at most this
  int64_t expert_capacity = 0;  // > 0: tokens an expert keeps at most; 0: no limit
  int64_t row_alignment = 1;    // each expert's rows padded to a multiple of this
  RouterConfig router;
  ActivationConfig activation;
  sfmoe_dtype dtype = SFMOE_DTYPE_BF16;             // x, W1, W2, y and the rows between them
  bool accumulate_weight_grads = false;             // dW1, dW2 are FP32 buffers added to
  sfmoe_moe_recipe recipe = SFMOE_MOE_RECIPE_BF16;  // the GEMM operands' formats
  uint64_t seed = 0;                                // NVFP4's stochastic rounding
  // Expert parallelism: ranks (experts % ep_world == 0), each rank's receive capacity in rows
  // (SFMOE_EP_CAPACITY_WORST_CASE: all it can be sent), its overflow policy, and SPILL's second
  // round (rows, or SFMOE_EP_CAPACITY_WORST_CASE). With SPILL the experts run over each round's
  // rows in turn, and the second round's weight gradients are added to the first's: SPILL needs
  // accumulate_weight_grads (FP32 main gradients) and the BF16 recipe.
  int64_t ep_world = 1;
  int64_t ep_receive_capacity = SFMOE_EP_CAPACITY_WORST_CASE;
  sfmoe_ep_overflow ep_overflow = SFMOE_EP_OVERFLOW_DROP;
  int64_t ep_spill_capacity = 0;
  int64_t ep_pair_capacity = SFMOE_EP_CAPACITY_WORST_CASE;  // rows a rank sends another at most
  // The loopback holds every rank in this process; NCCL (an EP group's) this process's `ep_rank`;
  // EXTERNAL one rank a call, in stages (the rank read on the device, the collectives the
  // caller's: src/ops/ep_stages.h).
  sfmoe_ep_transport ep_transport = SFMOE_EP_TRANSPORT_LOOPBACK;
  int32_t ep_rank = 0;

  int64_t local_experts() const { return experts / ep_world; }  // each rank's FFN groups
  // Over ranks (more than one, or a per-rank transport of any size).
  bool expert_parallel() const {
    return ep_world > 1 || ep_transport != SFMOE_EP_TRANSPORT_LOOPBACK;
  }
  // The ranks whose calls this process makes.
  int64_t local_ranks() const { return ep_transport == SFMOE_EP_TRANSPORT_LOOPBACK ? ep_world : 1; }
};

// A part of one of the layer's two buffers: [offset, offset + bytes).
struct Region {
  int64_t offset = 0;
  int64_t bytes = 0;
};

// Every buffer of a step. `saved` lives from a forward to its backward; `workspace` holds the
// temporaries of one call (forward or backward) and may be reused by the next.
struct MoeLayerPlan {
  int64_t row_capacity = 0;  // expert rows: every kept slot plus each expert's padding (with
                             // expert parallelism: a rank's received rows, at least)
  int64_t fc1_cols = 0;      // 2F (gated activations) or F
  // saved (fc1_rows holds d FC1 rows once the backward's FC2 part has run, d_probs its d probs)
  // (with expert parallelism the routing's row map, offsets and counts are the rank's EP handle,
  // ep_handle, and row_map / offsets / kept / dropped are empty)
  Region topk_ids, probs, router_counts, row_map, offsets, kept, dropped, fc1_rows, d_probs,
      ep_handle;
  // FP8 per-tensor: each local expert's amax of the x rows, W1 and W2 ([E_l] FP32 each), kept
  // by the forward's quantizations (the x rows' folded by permute) for the backward's, which then
  // read their input once instead of twice (amax, then codes); empty in other recipes.
  Region x_amax, w1_amax, w2_amax;
  int64_t saved_bytes = 0;
  ops::EpLayout ep;                             // the expert-parallel group's layout (ep_world > 1)
  const EpRankExchange* ep_exchange = nullptr;  // NCCL: the group's exchange and staging
  // EXTERNAL: each sequence's collectives (the forward; the backward whole, its FC2 part, its FC1
  // part: by sfmoe_moe_backward_part), between its stages.
  std::vector<ops::EpCollective> forward_collectives, backward_collectives[3];
  // (the three-part backward, FC2_DGRAD / FC1 / FC2_WGRAD, runs without expert parallelism)
  // workspace, in three nested prefixes: the backward's FC1 part's (fc1_backward_workspace_bytes),
  // then the forward's (forward_workspace_bytes), then the whole backward's. hidden_rows [R, H]
  // holds, in turn, x rows and FC2 rows (forward), d y rows (backward, FC2 part), x rows again and
  // d x rows (FC1 part); ffn_rows [R, F] the activations (forward), then FC2's dgrad and, over it,
  // the weighted activations (backward, FC2 part). routing_copy: the saved state's routing (its
  // prefix before fc1_rows, at the same offsets), copied by the FC2_DGRAD part for the FC2_WGRAD
  // part, which runs when `saved` may be gone.
  Region permute_workspace, router_workspace, gemm_workspace, hidden_rows, quantized_a, quantized_b,
      ffn_rows, row_probs, d_row_probs, routing_copy;
  // FP8 per-tensor: the amax of d FC1 rows (in the FC1 part's prefix: its wgrad's quantization
  // keeps it for its dgrad's) and of d y rows (after it: FC2's dgrad keeps it for FC2's wgrad,
  // which the three-part backward runs after the FC1 part).
  Region d_fc1_amax, d_y_amax;
  // The forward's FC1 reads its x rows straight from the tokens (gather_x_rows: the BF16 recipe
  // without expert parallelism, docs/moe_layer.md): permute writes the routing only and
  // row_sources [R] int32 each expert row's token (-1: none), in the forward's workspace.
  bool gather_x_rows = false;
  Region row_sources;
  // A quantized recipe's operands of each GEMM (a, b), each bound in quantized_a / quantized_b
  // when its GEMM runs (total_bytes 0: the layer's rows as they are).
  sfmoe_grouped_tensor_plan operands[kGemmSteps][2];
  // The weight cache (a call's weight_cache, weight_cache_bytes of it: 0 under BF16): each weight
  // operand's quantized copy (operands[step][1] of the four steps that read a weight) in a place
  // of its own, kept between calls whose weights do not change.
  Region weight_copies[kGemmSteps];
  int64_t weight_cache_bytes = 0;
  int64_t fc1_backward_workspace_bytes = 0;
  int64_t forward_workspace_bytes = 0;
  int64_t workspace_bytes = 0;  // the backward's, which covers the forward's
  // A backward's peak in two and in three parts, and the choice (sfmoe_moe_layer_plan's).
  int64_t backward_peak_two_parts = 0, backward_peak_three_parts = 0;
  bool three_part_backward = false;
};

// The expert-parallel group of a layer with ep_world > 1: its ranks, local experts, bounds and
// capacities (the API checks it as an EP configuration).
sfmoe_ep_config ep_config_of(const MoeLayerShape& shape);

// The plan of `shape` for the backend of `memory` (device workspaces only on the device).
Outcome plan_moe_layer(const MoeLayerShape& shape, sfmoe_memory memory, MoeLayerPlan* plan);

struct MoeForwardCall {
  int64_t tokens;            // T <= max_tokens
  const void* x;             // [T, H], shape.dtype
  const void* logits;        // [T, E]
  sfmoe_dtype logits_dtype;  // FP32 or BF16
  const float* expert_bias;  // [E] (selection only) or NULL
  const void* w1;            // [E, fc1_cols, H]
  const void* w2;            // [E, H, F]
  void* y;                   // [T, H], written
  float* aux_loss;           // [1] or NULL
  float* z_loss;             // [1] or NULL
  uint8_t* saved;            // plan.saved_bytes
  uint8_t* workspace;        // plan.workspace_bytes
  // plan.weight_cache_bytes, or NULL; filled: it holds w1's and w2's quantized copies for the
  // forward's GEMMs (made by an earlier call from the same weights), which then quantize nothing.
  uint8_t* weight_cache = nullptr;
  bool weight_cache_filled = false;
  sfmoe_memory memory;
  sfmoe_fault_report* word;  // device faults, or NULL
  void* stream;
};

struct MoeBackwardCall {
  sfmoe_moe_backward_part part;  // all of it, or one of its parts (sfmoe_moe_backward_part)
  int64_t tokens;                // the forward's T
  const void* x;                 // the forward's [T, H]
  const void* d_y;               // [T, H], shape.dtype
  const void* logits;            // the forward's
  sfmoe_dtype logits_dtype;
  const void* w1;
  const void* w2;
  float d_aux_loss, d_z_loss;         // upstream gradients of the losses
  uint64_t rng_offset;                // NVFP4's stochastic rounding: the Philox offset of this step
  const uint64_t* rng_offset_device;  // NULL, or added to rng_offset when the step runs
  void* d_x;                          // [T, H], written
  float* d_logits;                    // [T, E] FP32, written
  void* d_w1;                         // [E, fc1_cols, H]: shape.dtype, or FP32 added to
  void* d_w2;                         // [E, H, F]: likewise
  uint8_t* saved;                     // the forward's; its FC1 rows are overwritten
  uint8_t* workspace;
  uint8_t* weight_cache = nullptr;  // as the forward's, for the dgrad GEMMs' copies
  bool weight_cache_filled = false;
  sfmoe_memory memory;
  sfmoe_fault_report* word;
  void* stream;
};

// The weight cache filled from w1 and w2 (one rank's: [E_l, ...]): every copy the forward's and
// the backward's GEMMs read, so that calls given it filled quantize no weight.
sfmoe_status moe_layer_fill_weight_cache(const MoeLayerShape& shape, const MoeLayerPlan& plan,
                                         const void* w1, const void* w2, uint8_t* weight_cache,
                                         sfmoe_memory memory, sfmoe_fault_report* word,
                                         void* stream);

// Both enqueue the whole sequence on the call's stream; a failing step's reason is named by the
// step (name_reported_step) for the public call to word.
sfmoe_status moe_layer_forward(const MoeLayerShape& shape, const MoeLayerPlan& plan,
                               const MoeForwardCall& call);
sfmoe_status moe_layer_backward(const MoeLayerShape& shape, const MoeLayerPlan& plan,
                                const MoeBackwardCall& call);

// Expert parallelism over the loopback transport: calls[r] is rank r's call (its tokens and
// logits, its local experts' weights [E_l, ...], its outputs, saved state and workspace), for
// r < shape.local_ranks(); every step runs on calls[0]'s stream and reports to calls[0]'s word.
// With ep_world 1, the same as the single calls above.
sfmoe_status moe_layer_forward_ranks(const MoeLayerShape& shape, const MoeLayerPlan& plan,
                                     const MoeForwardCall* calls);
sfmoe_status moe_layer_backward_ranks(const MoeLayerShape& shape, const MoeLayerPlan& plan,
                                      const MoeBackwardCall* calls);

// The EXTERNAL transport: stage `index` of a sequence (0 .. its collectives), this rank `rank`
// ([1] INT32 where the layer runs), `received` what the previous stage's collective delivered
// (index > 0), `sent` written with what this stage's collective sends (index < collectives). A
// sequence's stages run in order on the same call (saved state and workspace kept between them).
struct MoeStage {
  int64_t index;
  const int32_t* rank;
  const void* received;
  void* sent;
};
sfmoe_status moe_layer_forward_stage(const MoeLayerShape& shape, const MoeLayerPlan& plan,
                                     const MoeForwardCall& call, const MoeStage& stage);
sfmoe_status moe_layer_backward_stage(const MoeLayerShape& shape, const MoeLayerPlan& plan,
                                      const MoeBackwardCall& call, const MoeStage& stage);

}  // namespace layer
}  // namespace sfmoe

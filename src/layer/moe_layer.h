// The MoE layer (docs/moe_layer.md): one expert-parallel-free MoE FFN, forward and backward, as a
// sequence of ops enqueued on one stream through the backend table (src/ops/backend.h), with no
// allocation, no synchronization and no validation of its own steps. The C API
// (src/api/moe_layer.cpp) validates a call once and hands this layer plain pointers.
//
// Forward:  router (top-k of the caller's logits) -> permute (expert-sorted rows, padding,
//           capacity) -> FC1 (grouped GEMM, W1 [E, 2F or F, H]) -> activation -> FC2 (grouped
//           GEMM, W2 [E, H, F]) -> unpermute (probability-weighted combine).
// Backward: unpermute backward (d rows, d probs) -> FC2 dgrad and wgrad (the activation
//           recomputed from FC1's saved output) -> activation backward -> FC1 dgrad and wgrad ->
//           permute backward (each token's k slots summed) -> router backward (d logits, the
//           loss gradients).
#pragma once

#include <stdint.h>

#include "sfmoe/sfmoe.h"
#include "src/common/activation_args.h"
#include "src/common/outcome.h"
#include "src/common/router_args.h"

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
  sfmoe_dtype dtype = SFMOE_DTYPE_BF16;  // x, W1, W2, y and the rows between them
  bool accumulate_weight_grads = false;  // dW1, dW2 are FP32 buffers added to
};

// A part of one of the layer's two buffers: [offset, offset + bytes).
struct Region {
  int64_t offset = 0;
  int64_t bytes = 0;
};

// Every buffer of a step. `saved` lives from a forward to its backward; `workspace` holds the
// temporaries of one call (forward or backward) and may be reused by the next.
struct MoeLayerPlan {
  int64_t row_capacity = 0;  // expert rows: every kept slot plus each expert's padding
  int64_t fc1_cols = 0;      // 2F (gated activations) or F
  // saved
  Region topk_ids, probs, router_counts, row_map, offsets, kept, dropped, x_rows, fc1_rows,
      fc2_rows;
  int64_t saved_bytes = 0;
  // workspace: the forward's regions first (its call needs only forward_workspace_bytes), then
  // the backward's
  Region permute_workspace, router_workspace, gemm_workspace, act_rows, d_probs, d_fc2_rows,
      d_act_rows, d_fc1_rows;
  int64_t forward_workspace_bytes = 0;
  int64_t workspace_bytes = 0;  // the backward's, which covers the forward's
};

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
  sfmoe_memory memory;
  sfmoe_fault_report* word;  // device faults, or NULL
  void* stream;
};

struct MoeBackwardCall {
  int64_t tokens;      // the forward's T
  const void* d_y;     // [T, H], shape.dtype
  const void* logits;  // the forward's
  sfmoe_dtype logits_dtype;
  const void* w1;
  const void* w2;
  float d_aux_loss, d_z_loss;  // upstream gradients of the losses
  void* d_x;                   // [T, H], written
  float* d_logits;             // [T, E] FP32, written
  void* d_w1;                  // [E, fc1_cols, H]: shape.dtype, or FP32 added to
  void* d_w2;                  // [E, H, F]: likewise
  const uint8_t* saved;        // the forward's
  uint8_t* workspace;
  sfmoe_memory memory;
  sfmoe_fault_report* word;
  void* stream;
};

// Both enqueue the whole sequence on the call's stream; a failing step's reason is named by the
// step (name_reported_step) for the public call to word.
sfmoe_status moe_layer_forward(const MoeLayerShape& shape, const MoeLayerPlan& plan,
                               const MoeForwardCall& call);
sfmoe_status moe_layer_backward(const MoeLayerShape& shape, const MoeLayerPlan& plan,
                                const MoeBackwardCall& call);

}  // namespace layer
}  // namespace sfmoe

// The router as the backends see it: plain pointers and sizes (docs/router.md has the rules).
#pragma once

#include <stdint.h>

#include "sfmoe/sfmoe.h"

namespace sfmoe {

struct RouterConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool sigmoid = false;             // score function: sigmoid, else softmax
  bool softmax_after_topk = false;  // softmax only: select on the logits, softmax over the k
  int64_t num_groups = 0;           // group-limited routing when > 1
  int64_t group_topk = 0;           // groups each token may use
  int64_t group_score_topk = 2;     // a group's score: the sum of its best this-many scores
  float scaling_factor = 1.0f;      // applied to the final probabilities
  bool normalize = false;           // the k probabilities divided by their sum (not softmax-after)
  float aux_loss_coeff = 0.0f;      // Switch/GShard load-balancing loss; 0: not computed
  float z_loss_coeff = 0.0f;        // z-loss; 0: not computed
};

// The CUDA router's bounds (docs/router.md): a token's scores live in the registers of a warp
// (16 per lane at most), group scores in two registers per lane, the picked experts in shared
// memory.
constexpr int kMaxDeviceExperts = 512;
constexpr int kMaxDeviceGroups = 64;
constexpr int kMaxDeviceTopK = 64;

// The forward's blocks (8 tokens each, at most 1024, grid-stride beyond): a function of the
// token count only, so that the loss partials, and the losses' bits, do not depend on the device.
// The workspace holds one row of E + 1 partial sums per block.
constexpr int64_t kRouterTokensPerBlock = 8;
constexpr int64_t kRouterMaxBlocks = 1024;
inline int64_t router_blocks(int64_t tokens) {
  const int64_t blocks = (tokens + kRouterTokensPerBlock - 1) / kRouterTokensPerBlock;
  return blocks < 1 ? 1 : (blocks < kRouterMaxBlocks ? blocks : kRouterMaxBlocks);
}
inline int64_t router_workspace_floats(int64_t tokens, int64_t experts) {
  return router_blocks(tokens) * (experts + 1);
}

// coeff * E / (k * T^2), the load-balancing loss's constant, rounded once to FP32; 0 for T = 0.
inline float router_aux_factor(const RouterConfig& c, int64_t tokens) {
  if (tokens == 0) return 0.0f;
  const double t = static_cast<double>(tokens);
  return static_cast<float>(static_cast<double>(c.aux_loss_coeff) *
                            static_cast<double>(c.num_experts) /
                            (static_cast<double>(c.top_k) * t * t));
}
// coeff / T, the z-loss's constant; 0 for T = 0.
inline float router_z_factor(const RouterConfig& c, int64_t tokens) {
  return tokens == 0 ? 0.0f
                     : static_cast<float>(static_cast<double>(c.z_loss_coeff) /
                                          static_cast<double>(tokens));
}

// One call of the router, as both backends take it.
struct RouterForwardArgs {
  const void* logits;        // [tokens, num_experts], FP32 or BF16
  sfmoe_dtype logits_dtype;  // FP32 or BF16
  const float* expert_bias;  // [num_experts] (selection only) or NULL
  int64_t tokens;
  RouterConfig config;
  int32_t* topk_ids;           // [tokens, top_k], best first
  float* probs;                // [tokens, top_k]
  int64_t* tokens_per_expert;  // [num_experts]
  float* aux_loss;             // [1] or NULL
  float* z_loss;               // [1] or NULL
  // Device, when a loss is asked for: router_workspace_floats(tokens, E) per-block partial sums
  // (summed in a fixed order: the losses' bits do not depend on the run). The host needs none.
  float* aux_partials;
};

struct RouterBackwardArgs {
  const void* logits;        // [tokens, num_experts], as given to the forward
  sfmoe_dtype logits_dtype;  // FP32 or BF16
  const int32_t* topk_ids;   // [tokens, top_k] from the forward
  const int64_t* tokens_per_expert;
  int64_t tokens;
  RouterConfig config;
  const float* d_probs;      // [tokens, top_k] or NULL
  float d_aux_loss;          // upstream gradient of aux_loss (usually 1)
  float d_z_loss;            // upstream gradient of z_loss
  float* d_logits;           // [tokens, num_experts], written
  sfmoe_fault_report* word;  // device: an id outside [0, E) is skipped and reported (or NULL)
};

}  // namespace sfmoe

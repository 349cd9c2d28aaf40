// The router as the backends see it: plain pointers and sizes (docs/router.md has the rules).
#pragma once

#include <stdint.h>

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

struct RouterForwardArgs {
  const float* logits;       // [tokens, num_experts]
  const float* expert_bias;  // [num_experts] (selection only) or NULL
  int64_t tokens;
  RouterConfig config;
  int32_t* topk_ids;           // [tokens, top_k], best first
  float* probs;                // [tokens, top_k]
  int64_t* tokens_per_expert;  // [num_experts]
  float* aux_loss;             // [1] or NULL
  float* z_loss;               // [1] or NULL
};

struct RouterBackwardArgs {
  const float* logits;      // [tokens, num_experts], as given to the forward
  const int32_t* topk_ids;  // [tokens, top_k] from the forward
  const int64_t* tokens_per_expert;
  int64_t tokens;
  RouterConfig config;
  const float* d_probs;  // [tokens, top_k] or NULL
  float d_aux_loss;      // upstream gradient of aux_loss (usually 1)
  float d_z_loss;        // upstream gradient of z_loss
  float* d_logits;       // [tokens, num_experts], written
};

}  // namespace sfmoe

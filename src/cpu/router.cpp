// The router's CPU reference: forward (top-k ids, probabilities, tokens per expert, losses) and
// backward (d logits). Per-token rules in src/cpu/router_math.h; docs/router.md states them.
#include <vector>

#include "src/cpu/backend.h"
#include "src/cpu/element_access.h"
#include "src/cpu/router_math.h"

namespace sfmoe {
namespace cpu {

namespace {

// The logits as FP32 (BF16 widens exactly): the reference computes in FP32 whatever they hold.
std::vector<float> logits_as_f32(const void* logits, sfmoe_dtype dtype, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = load_value(logits, dtype, i);
  return values;
}

}  // namespace

void router_forward(const RouterForwardArgs& args) {
  const RouterConfig& c = args.config;
  const int64_t n = c.num_experts, k = c.top_k;
  const std::vector<float> values = logits_as_f32(args.logits, args.logits_dtype, args.tokens * n);
  const float* logits = values.data();
  for (int64_t e = 0; e < n; ++e) args.tokens_per_expert[e] = 0;
  for (int64_t t = 0; t < args.tokens; ++t) {
    route_token<float>(logits + t * n, args.expert_bias, c, args.topk_ids + t * k,
                       args.probs + t * k);
    for (int64_t i = 0; i < k; ++i) ++args.tokens_per_expert[args.topk_ids[t * k + i]];
  }
  if (args.aux_loss != nullptr) {
    // sum_e count_e * (sum over tokens of the aux scores), scaled; sums in token, then expert
    // order.
    std::vector<float> column_sum(n, 0.0f), scores(n);
    for (int64_t t = 0; t < args.tokens; ++t) {
      aux_loss_scores<float>(logits + t * n, c, scores.data());
      for (int64_t e = 0; e < n; ++e) column_sum[e] = numerics::add_rn(column_sum[e], scores[e]);
    }
    float total = 0.0f;
    for (int64_t e = 0; e < n; ++e) {
      total = numerics::add_rn(
          total, numerics::mul_rn(static_cast<float>(args.tokens_per_expert[e]), column_sum[e]));
    }
    *args.aux_loss = numerics::mul_rn(total, router_aux_factor(c, args.tokens));
  }
  if (args.z_loss != nullptr) {
    float total = 0.0f;
    for (int64_t t = 0; t < args.tokens; ++t) {
      const float lse = log_sum_exp<float>(logits + t * n, n);
      total = numerics::add_rn(total, numerics::mul_rn(lse, lse));
    }
    *args.z_loss =
        args.tokens > 0 ? numerics::mul_rn(total, router_z_factor(c, args.tokens)) : 0.0f;
  }
}

void router_backward(const RouterBackwardArgs& args) {
  const RouterConfig& c = args.config;
  const int64_t n = c.num_experts, k = c.top_k;
  const std::vector<float> values = logits_as_f32(args.logits, args.logits_dtype, args.tokens * n);
  const float* logits = values.data();
  const float aux_factor = args.tokens > 0 ? router_aux_factor(c, args.tokens) : 0.0f;
  std::vector<float> scores(n), grad_scores(n), aux(n), softmax_all(n);
  for (int64_t t = 0; t < args.tokens; ++t) {
    const float* x = logits + t * n;
    float* dx = args.d_logits + t * n;
    for (int64_t e = 0; e < n; ++e) dx[e] = 0.0f;
    const int32_t* ids = args.topk_ids + t * k;

    // Probabilities: p_i = scale * u_i (/ sum u), u the scores of the selected experts.
    if (args.d_probs != nullptr) {
      const float* dp = args.d_probs + t * k;
      std::vector<float> u(k), du(k);
      if (!c.sigmoid && c.softmax_after_topk) {
        std::vector<float> picked(k);
        for (int64_t i = 0; i < k; ++i) picked[i] = x[ids[i]];
        softmax<float>(picked.data(), k, u.data());
        float dot = 0.0f;  // softmax over the selected logits: du -> d logits of the selected
        for (int64_t i = 0; i < k; ++i) dot += dp[i] * c.scaling_factor * u[i];
        for (int64_t i = 0; i < k; ++i) dx[ids[i]] += u[i] * (dp[i] * c.scaling_factor - dot);
      } else {
        token_scores<float>(x, c, scores.data());
        for (int64_t i = 0; i < k; ++i) u[i] = scores[ids[i]];
        float sum = 0.0f;
        for (int64_t i = 0; i < k; ++i) sum += u[i];
        const bool normalized = c.normalize && sum > 0.0f;
        float weighted = 0.0f;  // sum_j dp_j u_j
        for (int64_t i = 0; i < k; ++i) weighted += dp[i] * u[i];
        for (int64_t i = 0; i < k; ++i) {
          du[i] = c.scaling_factor * (normalized ? dp[i] / sum - weighted / (sum * sum) : dp[i]);
        }
        if (c.sigmoid) {
          for (int64_t i = 0; i < k; ++i) dx[ids[i]] += du[i] * u[i] * (1.0f - u[i]);
        } else {  // softmax over all experts: d x_e = s_e (g_e - sum_f g_f s_f)
          // g is zero off the selected experts, so the sum runs over those, in selection order:
          // an unselected NaN logit (score NaN) then spoils only its own gradient.
          for (int64_t e = 0; e < n; ++e) grad_scores[e] = 0.0f;
          for (int64_t i = 0; i < k; ++i) grad_scores[ids[i]] += du[i];
          float dot = 0.0f;
          for (int64_t i = 0; i < k; ++i) dot += du[i] * u[i];
          for (int64_t e = 0; e < n; ++e) dx[e] += scores[e] * (grad_scores[e] - dot);
        }
      }
    }

    // Load-balancing loss: d L / d a[t, e] = factor * count_e (counts are constants).
    if (c.aux_loss_coeff != 0.0f && args.d_aux_loss != 0.0f) {
      aux_loss_scores<float>(x, c, aux.data());
      float dot = 0.0f;
      for (int64_t e = 0; e < n; ++e) {
        grad_scores[e] =
            args.d_aux_loss * aux_factor * static_cast<float>(args.tokens_per_expert[e]);
        dot += grad_scores[e] * aux[e];
      }
      if (!c.sigmoid) {
        for (int64_t e = 0; e < n; ++e) dx[e] += aux[e] * (grad_scores[e] - dot);
      } else {  // a = sigma / sum sigma: d sigma_f = (g_f - dot) / sum; d x_f = sigma_f (1 -
                // sigma_f) d sigma_f
        token_scores<float>(x, c, scores.data());  // the sigmoids, once
        float sum = 0.0f;
        for (int64_t e = 0; e < n; ++e) sum += scores[e];
        for (int64_t e = 0; e < n; ++e) {
          dx[e] += scores[e] * (1.0f - scores[e]) * (grad_scores[e] - dot) / sum;
        }
      }
    }

    // z-loss: coeff / T * lse^2: d x_e = 2 coeff / T * lse * softmax(x)_e.
    if (c.z_loss_coeff != 0.0f && args.d_z_loss != 0.0f) {
      const float lse = log_sum_exp<float>(x, n);
      softmax<float>(x, n, softmax_all.data());
      const float factor =
          args.d_z_loss * 2.0f * c.z_loss_coeff / static_cast<float>(args.tokens) * lse;
      for (int64_t e = 0; e < n; ++e) dx[e] += factor * softmax_all[e];
    }
  }
}

}  // namespace cpu
}  // namespace sfmoe

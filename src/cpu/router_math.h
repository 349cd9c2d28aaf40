// The router's rules for one token, written once for two arithmetics: FP32 through the numerics
// headers (the definition, src/cpu/router.cpp) and float64 (the tests' finite-difference check).
// docs/router.md states the rules in words.
#pragma once

#include <stdint.h>

#include <cmath>
#include <vector>

#include "sfmoe/numerics/routing.h"
#include "src/common/router_args.h"
#include "src/cpu/arithmetic.h"

namespace sfmoe {
namespace cpu {

using numerics::ranks_before;

// A router sum (numerics::router_sum's order) in this arithmetic.
template <class Real>
Real router_sum(const Real* x, int64_t n) {
  return numerics::router_sum(x, n, [](Real a, Real b) { return Arithmetic<Real>::add(a, b); });
}

// softmax(x) over n values: the max, then e^(x - max) summed in the router-sum order (NaN logits
// contribute +0), then each divided.
// Non-finite logits follow the limits, so that one bad logit cannot decide a token's routing:
// a NaN logit takes no part (its score is NaN, which ranks last); when some logits are +Inf they
// share the probability equally and the others get 0; when every logit is -Inf the scores are
// uniform (all logits equal). Only NaN logits everywhere give NaN everywhere.
template <class Real>
void softmax(const Real* x, int64_t n, Real* out) {
  using A = Arithmetic<Real>;
  const Real inf = static_cast<Real>(INFINITY);
  bool any = false;
  Real max = 0;
  int64_t at_max = 0, counted = 0;
  for (int64_t e = 0; e < n; ++e) {
    if (x[e] != x[e]) continue;  // NaN
    if (!any || x[e] > max) max = x[e];
    any = true;
    ++counted;
  }
  for (int64_t e = 0; e < n; ++e) at_max += x[e] == max;
  if (any && (max == inf || max == -inf)) {
    // +Inf: the +Inf logits share 1; all -Inf: every non-NaN logit gets 1 / count.
    const Real share = A::div(Real(1), static_cast<Real>(max == inf ? at_max : counted));
    for (int64_t e = 0; e < n; ++e) {
      out[e] = x[e] != x[e] ? x[e] : (x[e] == max ? share : Real(0));
    }
    return;
  }
  std::vector<Real> terms(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) {
    if (x[e] != x[e]) {
      out[e] = x[e];
      terms[e] = Real(0);
      continue;
    }
    out[e] = A::exp(A::add(x[e], -max));
    terms[e] = out[e];
  }
  const Real sum = router_sum(terms.data(), n);
  for (int64_t e = 0; e < n; ++e) {
    if (x[e] == x[e]) out[e] = A::div(out[e], sum);
  }
}

// log(sum e^x) = max + log(sum e^(x - max)), the sum in the router-sum order.
template <class Real>
Real log_sum_exp(const Real* x, int64_t n) {
  using A = Arithmetic<Real>;
  Real max = x[0];
  for (int64_t e = 1; e < n; ++e) max = x[e] > max ? x[e] : max;
  std::vector<Real> terms(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) terms[e] = A::exp(A::add(x[e], -max));
  return A::add(max, A::log(router_sum(terms.data(), n)));
}

// The per-token scores the probabilities come from: softmax over all experts, or sigmoid; for
// softmax after top-k, the logits themselves (selection only).
template <class Real>
void token_scores(const Real* x, const RouterConfig& c, Real* scores) {
  using A = Arithmetic<Real>;
  if (c.sigmoid) {
    for (int64_t e = 0; e < c.num_experts; ++e) scores[e] = A::sigmoid(x[e]);
  } else if (c.softmax_after_topk) {
    for (int64_t e = 0; e < c.num_experts; ++e) scores[e] = x[e];
  } else {
    softmax(x, c.num_experts, scores);
  }
}

// Top-k of one token: ids (best first) and probabilities. `bias` (or NULL) is added to the scores
// for the selection only.
template <class Real>
void route_token(const Real* x, const float* bias, const RouterConfig& c, int32_t* ids,
                 Real* probs) {
  using A = Arithmetic<Real>;
  const int64_t n = c.num_experts, k = c.top_k;
  std::vector<Real> scores(n), selection(n);
  token_scores(x, c, scores.data());
  for (int64_t e = 0; e < n; ++e) {
    selection[e] = bias ? A::add(scores[e], static_cast<Real>(bias[e])) : scores[e];
  }
  std::vector<bool> allowed(n, true);
  if (c.num_groups > 1) {
    // Group score: the sum of the group's best group_score_topk selection scores, best first.
    const int64_t per_group = n / c.num_groups;
    std::vector<Real> group_score(c.num_groups);
    for (int64_t g = 0; g < c.num_groups; ++g) {
      std::vector<bool> taken(per_group, false);
      Real sum = 0;
      for (int64_t pick = 0; pick < c.group_score_topk; ++pick) {
        int64_t best = -1;
        for (int64_t j = 0; j < per_group; ++j) {
          const int64_t e = g * per_group + j;
          if (!taken[j] &&
              (best < 0 || ranks_before(selection[e], e, selection[g * per_group + best],
                                        g * per_group + best))) {
            best = j;
          }
        }
        taken[best] = true;
        sum = A::add(sum, selection[g * per_group + best]);
      }
      group_score[g] = sum;
    }
    std::vector<bool> group_kept(c.num_groups, false);
    for (int64_t pick = 0; pick < c.group_topk; ++pick) {
      int64_t best = -1;
      for (int64_t g = 0; g < c.num_groups; ++g) {
        if (!group_kept[g] &&
            (best < 0 || ranks_before(group_score[g], g, group_score[best], best))) {
          best = g;
        }
      }
      group_kept[best] = true;
    }
    for (int64_t e = 0; e < n; ++e) allowed[e] = group_kept[e / per_group];
  }
  std::vector<bool> taken(n, false);
  for (int64_t i = 0; i < k; ++i) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      if (allowed[e] && !taken[e] &&
          (best < 0 || ranks_before(selection[e], e, selection[best], best))) {
        best = e;
      }
    }
    taken[best] = true;
    ids[i] = static_cast<int32_t>(best);
  }
  // Probabilities of the selected experts, in selection order.
  if (!c.sigmoid && c.softmax_after_topk) {
    std::vector<Real> picked(k);
    for (int64_t i = 0; i < k; ++i) picked[i] = x[ids[i]];
    softmax(picked.data(), k, probs);
  } else {
    for (int64_t i = 0; i < k; ++i) probs[i] = scores[ids[i]];
    if (c.normalize) {
      Real sum = 0;
      for (int64_t i = 0; i < k; ++i) sum = A::add(sum, probs[i]);
      if (sum > 0) {
        for (int64_t i = 0; i < k; ++i) probs[i] = A::div(probs[i], sum);
      }
    }
  }
  for (int64_t i = 0; i < k; ++i) probs[i] = A::mul(probs[i], static_cast<Real>(c.scaling_factor));
}

// The scores the load-balancing loss averages: softmax over all experts, or the sigmoid scores
// divided by their sum (so that they form a distribution too).
template <class Real>
void aux_loss_scores(const Real* x, const RouterConfig& c, Real* out) {
  using A = Arithmetic<Real>;
  if (!c.sigmoid) {
    softmax(x, c.num_experts, out);
    return;
  }
  for (int64_t e = 0; e < c.num_experts; ++e) out[e] = A::sigmoid(x[e]);
  const Real sum = router_sum(out, c.num_experts);
  for (int64_t e = 0; e < c.num_experts; ++e) out[e] = A::div(out[e], sum);
}

}  // namespace cpu
}  // namespace sfmoe

// The router's numerics and its CPU reference (docs/router.md): exp/sigmoid accuracy, hand-worked
// routing cases (tie-break, bias, group-limited, softmax after top-k, NaN), a DeepSeek-V3-shaped
// case (T = 4097, E = 256, k = 8, 8 groups, experts that receive nothing), and the backward
// against float64 central differences of the forward. Inputs are fresh random values each run
// (the seed is printed; SFMOE_TEST_SEED replays it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <set>
#include <vector>

#include "sfmoe/numerics.h"
#include "sfmoe/router.h"
#include "src/cpu/backend.h"
#include "src/cpu/router_math.h"
#include "tests/cpp/host_descriptors.h"
#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace {

using numerics::exp_f32;
using numerics::sigmoid_f32;

int64_t ulps_from(float got, double want) {
  const float rounded = static_cast<float>(want);
  int32_t a, b;
  std::memcpy(&a, &got, 4);
  std::memcpy(&b, &rounded, 4);
  return std::llabs(static_cast<int64_t>(a) - b);
}

TEST(RouterNumerics, ExpAndSigmoidStayWithinTwoUlps) {
  std::mt19937_64 rng(testing::session_test_seed());
  std::uniform_real_distribution<float> wide(-104.0f, 89.0f), narrow(-20.0f, 20.0f);
  int64_t worst_exp = 0, worst_sigmoid = 0, checked = 0;
  auto check = [&](float x) {
    const double e = std::exp(static_cast<double>(x));
    if (e >= 1.1754943508222875e-38 && e <= 3.4028234663852886e38) {
      worst_exp = std::max(worst_exp, ulps_from(exp_f32(x), e));
      ++checked;
    }
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    if (x >= -87.0f)  // below, sigmoid_f32 gives 0 by definition (true values under 1.7e-38)
      worst_sigmoid = std::max(worst_sigmoid, ulps_from(sigmoid_f32(x), s));
  };
  for (int i = 0; i < 1000000; ++i) {
    check(wide(rng));
    check(narrow(rng));
  }
  for (uint32_t bits = 0; bits < 0x43000000u; bits += 4093) {  // |x| below 128, both signs
    float x;
    std::memcpy(&x, &bits, 4);
    check(x);
    check(-x);
  }
  std::printf("[ router ] exp_f32 over %lld inputs: worst %lld ulp; sigmoid_f32 worst %lld ulp\n",
              static_cast<long long>(checked), static_cast<long long>(worst_exp),
              static_cast<long long>(worst_sigmoid));
  EXPECT_LE(worst_exp, 2);
  EXPECT_LE(worst_sigmoid, 2);
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_TRUE(std::isinf(exp_f32(89.0f)));
  EXPECT_TRUE(std::isinf(exp_f32(INFINITY)));
  EXPECT_EQ(exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(exp_f32(-104.0f), 0.0f);
  EXPECT_GT(exp_f32(-100.0f), 0.0f);  // a subnormal result
  EXPECT_TRUE(std::isnan(exp_f32(NAN)));
  EXPECT_EQ(sigmoid_f32(0.0f), 0.5f);
  EXPECT_EQ(sigmoid_f32(-200.0f), 0.0f);
  EXPECT_EQ(sigmoid_f32(200.0f), 1.0f);
  EXPECT_EQ(sigmoid_f32(-87.01f), 0.0f);
  EXPECT_GT(sigmoid_f32(-87.0f), 1.6e-38f);
  EXPECT_EQ(sigmoid_f32(-INFINITY), 0.0f);
  EXPECT_EQ(sigmoid_f32(INFINITY), 1.0f);
  EXPECT_TRUE(std::isnan(sigmoid_f32(NAN)));
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> probs;
  std::vector<int64_t> tokens_per_expert;
  float aux_loss = 0.0f, z_loss = 0.0f;
};

Routed route(const std::vector<float>& logits, const std::vector<float>* bias,
             const RouterConfig& c) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / c.num_experts;
  Routed out;
  out.ids.assign(tokens * c.top_k, -1);
  out.probs.assign(tokens * c.top_k, NAN);
  out.tokens_per_expert.assign(c.num_experts, -1);
  RouterForwardArgs args{
      logits.data(),  SFMOE_DTYPE_FP32, bias ? bias->data() : nullptr, tokens,        c,
      out.ids.data(), out.probs.data(), out.tokens_per_expert.data(),  &out.aux_loss, &out.z_loss,
      nullptr};
  cpu::router_forward(args);
  return out;
}

RouterConfig config(int64_t experts, int64_t k) {
  RouterConfig c;
  c.num_experts = experts;
  c.top_k = k;
  return c;
}

TEST(RouterCpu, HandWorkedCases) {
  {  // softmax before top-k; equal scores: the lower id first
    const RouterConfig c = config(4, 2);
    const Routed r = route({1.0f, 3.0f, 3.0f, 0.0f}, nullptr, c);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
    const double p = std::exp(3.0) / (std::exp(1.0) + 2 * std::exp(3.0) + 1.0);
    EXPECT_NEAR(r.probs[0], p, 1e-6);
    EXPECT_EQ(r.probs[0], r.probs[1]);
    EXPECT_EQ(r.tokens_per_expert, (std::vector<int64_t>{0, 1, 1, 0}));
  }
  {  // sigmoid: the bias moves the selection, not the probabilities; normalize, then scale
    RouterConfig c = config(4, 2);
    c.sigmoid = true;
    c.normalize = true;
    c.scaling_factor = 2.5f;
    const std::vector<float> bias = {0.0f, 0.1f, -0.1f, 0.2f};
    const Routed r = route({0.0f, 0.0f, 0.0f, 0.0f}, &bias, c);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1}));
    EXPECT_EQ(r.probs, (std::vector<float>{1.25f, 1.25f}));
  }
  {  // group-limited: the best expert's group loses on its two-best sum
    RouterConfig c = config(8, 2);
    c.sigmoid = true;
    c.num_groups = 4;
    c.group_topk = 2;
    const std::vector<float> logits = {5.0f, -5.0f, 2.0f, 2.0f, 1.5f, 1.5f, 0.0f, 0.0f};
    EXPECT_EQ(route(logits, nullptr, c).ids, (std::vector<int32_t>{2, 3}));
    c.num_groups = 0;
    EXPECT_EQ(route(logits, nullptr, c).ids, (std::vector<int32_t>{0, 2}));
  }
  {  // softmax after top-k: the probabilities are a softmax over the selected logits
    RouterConfig c = config(3, 2);
    c.softmax_after_topk = true;
    const Routed r = route({2.0f, 0.0f, 1.0f}, nullptr, c);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
    EXPECT_NEAR(r.probs[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-7);
    EXPECT_NEAR(r.probs[0] + r.probs[1], 1.0, 1e-7);
  }
  {  // a NaN logit is never preferred, and does not spoil the token's other scores
    RouterConfig c = config(3, 1);
    c.softmax_after_topk = true;
    EXPECT_EQ(route({NAN, 1.0f, 0.0f}, nullptr, c).ids, (std::vector<int32_t>{1}));
    c.softmax_after_topk = false;
    const Routed r = route({NAN, 1.0f, 5.0f}, nullptr, c);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{2}));
    EXPECT_NEAR(r.probs[0], 1.0 / (1.0 + std::exp(-4.0)), 1e-6);
    c.sigmoid = true;
    EXPECT_EQ(route({NAN, 1.0f, 5.0f}, nullptr, c).ids, (std::vector<int32_t>{2}));
  }
  {  // infinite logits take the softmax's limits: +Inf ones share 1, all -Inf is uniform
    RouterConfig c = config(3, 2);
    Routed r = route({1.0f, 0.0f, INFINITY}, nullptr, c);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
    EXPECT_EQ(r.probs, (std::vector<float>{1.0f, 0.0f}));
    r = route({INFINITY, INFINITY, 0.0f}, nullptr, c);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(r.probs, (std::vector<float>{0.5f, 0.5f}));
    r = route({-INFINITY, -INFINITY, -INFINITY}, nullptr, c);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(r.probs[0], 1.0f / 3.0f);
    EXPECT_EQ(r.probs[1], 1.0f / 3.0f);
  }
}

TEST(RouterCpu, DeepSeekShapedRoutingWithIdleExperts) {
  const int64_t tokens = 4097, experts = 256, k = 8, groups = 8;
  RouterConfig c = config(experts, k);
  c.sigmoid = true;
  c.normalize = true;
  c.scaling_factor = 2.5f;
  c.num_groups = groups;
  c.group_topk = 4;
  c.aux_loss_coeff = 1e-3f;
  c.z_loss_coeff = 1e-4f;
  std::mt19937_64 rng(testing::session_test_seed() + 1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(tokens * experts), bias(experts);
  for (float& v : logits) v = normal(rng);
  for (int64_t e = 0; e < experts; ++e) bias[e] = e % 16 == 5 ? -100.0f : 0.01f * normal(rng);
  const Routed r = route(logits, &bias, c);

  std::vector<int64_t> recount(experts, 0);
  for (int64_t t = 0; t < tokens; ++t) {
    std::set<int32_t> seen, used_groups;
    const int32_t* ids = &r.ids[t * k];
    std::vector<float> selection(experts);
    for (int64_t e = 0; e < experts; ++e) {
      selection[e] = numerics::add_rn(sigmoid_f32(logits[t * experts + e]), bias[e]);
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_GE(ids[i], 0);
      ASSERT_LT(ids[i], experts);
      EXPECT_TRUE(seen.insert(ids[i]).second)
          << "token " << t << " picks expert " << ids[i] << " twice";
      used_groups.insert(ids[i] / (experts / groups));
      ++recount[ids[i]];
      if (i > 0) {
        EXPECT_TRUE(
            cpu::ranks_before(selection[ids[i - 1]], ids[i - 1], selection[ids[i]], ids[i]));
      }
      sum += sigmoid_f32(logits[t * experts + ids[i]]);
    }
    EXPECT_LE(static_cast<int64_t>(used_groups.size()), c.group_topk);
    // Within the kept groups, nothing unselected ranks before the last selected expert.
    for (int64_t e = 0; e < experts; ++e) {
      if (seen.count(static_cast<int32_t>(e)) ||
          !used_groups.count(static_cast<int32_t>(e / (experts / groups))))
        continue;
      EXPECT_FALSE(cpu::ranks_before(selection[e], e, selection[ids[k - 1]], ids[k - 1]))
          << "token " << t << ": expert " << e << " should have been picked";
    }
    for (int64_t i = 0; i < k; ++i) {
      const double want = 2.5 * sigmoid_f32(logits[t * experts + ids[i]]) / sum;
      EXPECT_NEAR(r.probs[t * k + i], want, 1e-6 * want);
    }
  }
  EXPECT_EQ(r.tokens_per_expert, recount);
  int64_t total = 0, idle = 0;
  for (int64_t e = 0; e < experts; ++e) {
    total += r.tokens_per_expert[e];
    if (e % 16 == 5) {
      EXPECT_EQ(r.tokens_per_expert[e], 0) << "expert " << e;
    }
    idle += r.tokens_per_expert[e] == 0;
  }
  EXPECT_EQ(total, tokens * k);
  EXPECT_GE(idle, experts / 16);
  EXPECT_GT(r.aux_loss, 0.0f);
  EXPECT_GT(r.z_loss, 0.0f);
}

// The loss whose gradient the backward computes, in float64: sum_t,i w[t,i] p[t,i] + aux + z,
// with the token counts held at the forward's values (they are piecewise constant).
double loss64(const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<int64_t>& counts, const RouterConfig& c, int64_t tokens,
              std::vector<int32_t>* ids_out) {
  const int64_t n = c.num_experts, k = c.top_k;
  std::vector<int32_t> ids(k);
  std::vector<double> probs(k), aux(n), column(n, 0.0);
  double total = 0.0, z = 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    cpu::route_token<double>(&x[t * n], nullptr, c, ids.data(), probs.data());
    for (int64_t i = 0; i < k; ++i) total += w[t * k + i] * probs[i];
    if (ids_out) ids_out->insert(ids_out->end(), ids.begin(), ids.end());
    cpu::aux_loss_scores<double>(&x[t * n], c, aux.data());
    for (int64_t e = 0; e < n; ++e) column[e] += aux[e];
    const double lse = cpu::log_sum_exp<double>(&x[t * n], n);
    z += lse * lse;
  }
  double balance = 0.0;
  for (int64_t e = 0; e < n; ++e) balance += static_cast<double>(counts[e]) * column[e];
  return total + c.aux_loss_coeff * n / (double(k) * tokens * tokens) * balance +
         c.z_loss_coeff / tokens * z;
}

TEST(RouterCpu, BackwardMatchesFloat64FiniteDifferences) {
  std::mt19937_64 rng(testing::session_test_seed() + 2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Variant {
    const char* name;
    bool sigmoid, after, normalize;
    int64_t groups;
    float scale;
  };
  const Variant variants[] = {
      {"softmax", false, false, false, 0, 1.0f},
      {"softmax normalized", false, false, true, 0, 1.0f},
      {"softmax after top-k", false, true, false, 0, 1.0f},
      {"sigmoid normalized scaled", true, false, true, 0, 2.5f},
      {"sigmoid grouped", true, false, false, 4, 1.0f},
  };
  const int64_t tokens = 5, experts = 12, k = 3;
  for (const Variant& v : variants) {
    RouterConfig c = config(experts, k);
    c.sigmoid = v.sigmoid;
    c.softmax_after_topk = v.after;
    c.normalize = v.normalize;
    c.num_groups = v.groups;
    c.group_topk = 2;
    c.scaling_factor = v.scale;
    c.aux_loss_coeff = 0.3f;
    c.z_loss_coeff = 0.05f;
    std::vector<float> logits(tokens * experts), w(tokens * k);
    for (float& x : logits) x = normal(rng);
    for (float& x : w) x = normal(rng);
    const Routed r = route(logits, nullptr, c);
    std::vector<float> d_logits(tokens * experts, NAN);
    RouterBackwardArgs back{logits.data(), SFMOE_DTYPE_FP32,
                            r.ids.data(),  r.tokens_per_expert.data(),
                            tokens,        c,
                            w.data(),      1.0f,
                            1.0f,          d_logits.data(),
                            nullptr};
    cpu::router_backward(back);

    std::vector<double> x(logits.begin(), logits.end()), w64(w.begin(), w.end());
    int64_t checked = 0;
    double worst = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double h = 1e-6, saved = x[i];
      std::vector<int32_t> ids_plus, ids_minus;
      x[i] = saved + h;
      const double plus = loss64(x, w64, r.tokens_per_expert, c, tokens, &ids_plus);
      x[i] = saved - h;
      const double minus = loss64(x, w64, r.tokens_per_expert, c, tokens, &ids_minus);
      x[i] = saved;
      ASSERT_EQ(ids_plus, ids_minus)
          << v.name << ": a step of 1e-6 changed the routing (a near tie)";
      const double fd = (plus - minus) / (2 * h);
      const double error = std::fabs(d_logits[i] - fd);
      worst = std::max(worst, error / (1e-4 + std::fabs(fd)));
      EXPECT_LE(error, 1e-4 + 1e-3 * std::fabs(fd)) << v.name << " logit " << i << ": backward "
                                                    << d_logits[i] << ", finite difference " << fd;
      ++checked;
    }
    std::printf("[ router ] %-26s %lld gradients, worst |d - fd| / (1e-4 + |fd|) = %.2e\n", v.name,
                static_cast<long long>(checked), worst);
  }
}

// An unselected NaN logit takes no part in the forward; in the backward it spoils only its own
// gradient: every other d logit has the bits it has when that logit is -Inf (score 0 either way).
TEST(RouterCpu, BackwardOfAnUnselectedNanLogitSpoilsOnlyItsOwnGradient) {
  std::mt19937_64 rng(testing::session_test_seed() + 3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t experts = 7, k = 2;
  for (const bool normalize : {false, true}) {
    RouterConfig c = config(experts, k);
    c.normalize = normalize;
    std::vector<float> logits(experts), w(k);
    for (float& x : logits) x = normal(rng);
    for (float& x : w) x = normal(rng);
    const Routed before = route(logits, nullptr, c);
    int64_t bad = 0;  // an expert the routing did not select
    while (bad == before.ids[0] || bad == before.ids[1]) ++bad;
    auto backward = [&](float value, std::vector<int32_t>* ids) {
      std::vector<float> x = logits, d(experts, 0.0f);
      x[bad] = value;
      const Routed r = route(x, nullptr, c);
      *ids = r.ids;
      RouterBackwardArgs args{x.data(),
                              SFMOE_DTYPE_FP32,
                              r.ids.data(),
                              r.tokens_per_expert.data(),
                              1,
                              c,
                              w.data(),
                              0.0f,
                              0.0f,
                              d.data(),
                              nullptr};
      cpu::router_backward(args);
      return d;
    };
    std::vector<int32_t> ids_nan, ids_inf;
    const std::vector<float> with_nan = backward(NAN, &ids_nan);
    const std::vector<float> with_inf = backward(-INFINITY, &ids_inf);
    ASSERT_EQ(ids_nan, ids_inf);
    EXPECT_TRUE(std::isnan(with_nan[bad]));
    for (int64_t e = 0; e < experts; ++e) {
      if (e == bad) continue;
      EXPECT_TRUE(std::isfinite(with_nan[e])) << "expert " << e;
      EXPECT_EQ(std::memcmp(&with_nan[e], &with_inf[e], 4), 0)
          << "expert " << e << ": " << with_nan[e] << " vs " << with_inf[e];
    }
  }
}

}  // namespace
}  // namespace sfmoe

namespace sfmoe {
namespace {

using testing::host_tensor;

TEST(RouterApi, ThroughTheCApiAndItsRefusals) {
  const int64_t tokens = 37, experts = 32, k = 4;
  std::mt19937_64 rng(testing::session_test_seed() + 3);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<uint16_t> logits_bf16(tokens * experts);
  std::vector<float> logits_f32(tokens * experts), bias(experts);
  for (size_t i = 0; i < logits_bf16.size(); ++i) {
    logits_bf16[i] = numerics::f32_to_bf16(normal(rng));
    logits_f32[i] = numerics::bf16_to_f32(logits_bf16[i]);
  }
  for (float& b : bias) b = 0.05f * normal(rng);
  std::vector<int32_t> ids(tokens * k, -1);
  std::vector<float> probs(tokens * k, NAN), aux(1, NAN), z(1, NAN);
  std::vector<int64_t> counts(experts, -1);
  sfmoe_tensor t_logits = host_tensor(logits_bf16.data(), SFMOE_DTYPE_BF16, {tokens, experts});
  sfmoe_tensor t_bias = host_tensor(bias.data(), SFMOE_DTYPE_FP32, {experts});
  sfmoe_tensor t_ids = host_tensor(ids.data(), SFMOE_DTYPE_INT32, {tokens, k});
  sfmoe_tensor t_probs = host_tensor(probs.data(), SFMOE_DTYPE_FP32, {tokens, k});
  sfmoe_tensor t_counts = host_tensor(counts.data(), SFMOE_DTYPE_INT64, {experts});
  sfmoe_tensor t_aux = host_tensor(aux.data(), SFMOE_DTYPE_FP32, {1});
  sfmoe_tensor t_z = host_tensor(z.data(), SFMOE_DTYPE_FP32, {});
  sfmoe_router_config config = sfmoe_router_config_init();
  config.top_k = k;
  config.score = SFMOE_ROUTER_SCORE_SIGMOID;
  config.num_groups = 4;
  config.group_topk = 2;
  config.normalize = 1;
  config.scaling_factor = 2.5f;
  config.aux_loss_coeff = 1e-2f;
  config.z_loss_coeff = 1e-3f;
  ASSERT_EQ(sfmoe_router_forward(&t_logits, &t_bias, &config, &t_ids, &t_probs, &t_counts, &t_aux,
                                 &t_z, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();

  // The same as the reference on the widened logits, bit for bit.
  RouterConfig c;
  c.num_experts = experts;
  c.top_k = k;
  c.sigmoid = true;
  c.num_groups = 4;
  c.group_topk = 2;
  c.normalize = true;
  c.scaling_factor = 2.5f;
  c.aux_loss_coeff = 1e-2f;
  c.z_loss_coeff = 1e-3f;
  const Routed want = route(logits_f32, &bias, c);
  EXPECT_EQ(ids, want.ids);
  EXPECT_EQ(std::memcmp(probs.data(), want.probs.data(), probs.size() * 4), 0);
  EXPECT_EQ(counts, want.tokens_per_expert);
  EXPECT_EQ(aux[0], want.aux_loss);
  EXPECT_EQ(z[0], want.z_loss);

  std::vector<float> d_probs(tokens * k, 1.0f), d_logits(tokens * experts, NAN);
  sfmoe_tensor t_dprobs = host_tensor(d_probs.data(), SFMOE_DTYPE_FP32, {tokens, k});
  sfmoe_tensor t_dlogits = host_tensor(d_logits.data(), SFMOE_DTYPE_FP32, {tokens, experts});
  ASSERT_EQ(sfmoe_router_backward(&t_logits, &t_ids, &t_counts, &config, &t_dprobs, 1.0f, 1.0f,
                                  &t_dlogits, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  for (float v : d_logits) ASSERT_TRUE(std::isfinite(v));

  // Refusals leave the outputs alone.
  const std::vector<int32_t> ids_before = ids;
  auto refused = [&](sfmoe_router_config bad, sfmoe_status want_status, const char* what) {
    EXPECT_EQ(sfmoe_router_forward(&t_logits, &t_bias, &bad, &t_ids, &t_probs, &t_counts, &t_aux,
                                   &t_z, nullptr, nullptr),
              want_status)
        << what << ": " << sfmoe_last_error();
    EXPECT_EQ(ids, ids_before) << what;
  };
  sfmoe_router_config bad = config;
  bad.top_k = 0;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "top_k 0");
  bad = config;
  bad.num_groups = 5;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "groups that do not divide the experts");
  bad = config;
  bad.group_topk = 0;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "no group kept");
  bad = config;
  bad.softmax_after_topk = 1;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "softmax after top-k with sigmoid scores");
  bad = config;
  bad.scaling_factor = 0.0f;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "zero scaling");
  bad = config;
  bad.struct_size = 8;
  refused(bad, SFMOE_ERROR_STRUCT_SIZE, "struct size");
  EXPECT_EQ(sfmoe_router_forward(&t_logits, &t_bias, &config, &t_ids, &t_probs, &t_counts, nullptr,
                                 &t_z, nullptr, nullptr),
            SFMOE_ERROR_NULL_POINTER);
  sfmoe_tensor wrong_ids = host_tensor(ids.data(), SFMOE_DTYPE_INT32, {tokens, k + 1});
  EXPECT_EQ(sfmoe_router_forward(&t_logits, &t_bias, &config, &wrong_ids, &t_probs, &t_counts,
                                 &t_aux, &t_z, nullptr, nullptr),
            SFMOE_ERROR_SHAPE_MISMATCH);
  sfmoe_tensor int64_ids = host_tensor(ids.data(), SFMOE_DTYPE_INT64, {tokens, k});
  EXPECT_EQ(sfmoe_router_forward(&t_logits, &t_bias, &config, &int64_ids, &t_probs, &t_counts,
                                 &t_aux, &t_z, nullptr, nullptr),
            SFMOE_ERROR_DTYPE_MISMATCH);
  EXPECT_EQ(ids, ids_before);
  // A backward given ids that are not experts writes nothing.
  ids[5] = static_cast<int32_t>(experts);
  std::fill(d_logits.begin(), d_logits.end(), 7.0f);
  EXPECT_EQ(sfmoe_router_backward(&t_logits, &t_ids, &t_counts, &config, &t_dprobs, 1.0f, 1.0f,
                                  &t_dlogits, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  for (float v : d_logits) ASSERT_EQ(v, 7.0f);
}

}  // namespace
}  // namespace sfmoe

// Router, permute / unpermute and grouped activations: the CUDA backend against the CPU backend
// (the definition) through the C API, byte for byte over buffers poisoned alike beforehand (so
// "not written" must agree too) wherever the op is exact; the losses and gradients within stated
// tolerances; faults on bad ids; and the chain router -> permute -> activation -> unpermute
// captured in one graph (global mode) and replayed on new logits, checked each replay.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "sfmoe/activation.h"
#include "sfmoe/numerics.h"
#include "sfmoe/permute.h"
#include "sfmoe/router.h"
#include "src/cpu/activation_math.h"
#include "src/ops/backend.h"
#include "tests/cpp/host_descriptors.h"
#include "tests/cpp/numerics_cases.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

// A buffer held twice, on the host and on the device, with the same starting bytes.
template <class T>
struct Twin {
  std::vector<T> host;
  DeviceBuffer<T> device;
  explicit Twin(std::vector<T> start) : host(std::move(start)), device(host.size()) {
    EXPECT_EQ(device.upload(host), cudaSuccess);
  }
  Twin(size_t n, T poison) : Twin(std::vector<T>(n, poison)) {}
  T* on(sfmoe_memory m) { return m == SFMOE_MEMORY_HOST ? host.data() : device.ptr; }
  // The device's bytes equal the host's.
  ::testing::AssertionResult same(const char* what) const {
    const std::vector<T> got = device.download();
    if (got.size() != host.size())
      return ::testing::AssertionFailure() << what << ": download failed";
    if (got.empty() || std::memcmp(got.data(), host.data(), host.size() * sizeof(T)) == 0) {
      return ::testing::AssertionSuccess();
    }
    size_t first = 0;
    while (std::memcmp(&got[first], &host[first], sizeof(T)) == 0) ++first;
    size_t differ = 0;
    for (size_t i = 0; i < host.size(); ++i)
      differ += std::memcmp(&got[i], &host[i], sizeof(T)) != 0;
    return ::testing::AssertionFailure() << what << ": " << differ << " of " << host.size()
                                         << " elements differ, first at " << first;
  }
};

constexpr sfmoe_memory kBoth[] = {SFMOE_MEMORY_HOST, SFMOE_MEMORY_CUDA};

// Logits with near-ties and the special values: equal pairs, +-0, +-Inf, NaN, large magnitudes.
std::vector<float> make_logits(std::mt19937_64& rng, int64_t tokens, int64_t experts,
                               bool specials) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(tokens * experts);
  for (float& v : x) v = normal(rng);
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = &x[t * experts];
    const uint64_t dice = rng() % 64;
    if (dice < 8) row[rng() % experts] = row[rng() % experts];  // an exact tie
    if (dice == 8) std::fill(row, row + experts, 0.5f);         // every expert tied
    if (!specials) continue;
    if (dice == 9) row[rng() % experts] = NAN;
    if (dice == 10) row[rng() % experts] = INFINITY;
    if (dice == 11) row[rng() % experts] = INFINITY, row[rng() % experts] = INFINITY;
    if (dice == 12) std::fill(row, row + experts, -INFINITY);
    if (dice == 13) row[rng() % experts] = -0.0f, row[rng() % experts] = 0.0f;
    if (dice == 14) row[rng() % experts] = 1e30f;
    if (dice == 15) std::fill(row, row + experts, NAN);
  }
  return x;
}

struct RouterCase {
  std::string name;
  int64_t experts, top_k;
  sfmoe_router_config config;
  bool bias, bf16;
};

std::vector<RouterCase> router_cases() {
  std::vector<RouterCase> cases;
  auto base = [](int64_t k) {
    sfmoe_router_config c = sfmoe_router_config_init();
    c.top_k = k;
    return c;
  };
  sfmoe_router_config c = base(8);
  c.score = SFMOE_ROUTER_SCORE_SIGMOID;
  c.num_groups = 8;
  c.group_topk = 4;
  c.normalize = 1;
  c.scaling_factor = 2.5f;
  c.aux_loss_coeff = 1e-3f;
  cases.push_back({"deepseek-v3 (sigmoid, bias, 8 groups)", 256, 8, c, true, false});
  c = base(8);
  c.normalize = 1;
  c.aux_loss_coeff = 1e-2f;
  c.z_loss_coeff = 1e-3f;
  cases.push_back({"qwen3 (softmax, normalize, losses)", 128, 8, c, false, false});
  c = base(2);
  c.softmax_after_topk = 1;
  cases.push_back({"mixtral (softmax after top-k)", 8, 2, c, false, true});
  c = base(6);
  c.num_groups = 5;
  c.group_topk = 2;
  c.group_score_topk = 3;
  c.z_loss_coeff = 1e-2f;
  cases.push_back({"60 experts, 5 groups of 12, bf16", 60, 6, c, true, true});
  c = base(1);
  c.score = SFMOE_ROUTER_SCORE_SIGMOID;
  c.aux_loss_coeff = 1e-2f;
  cases.push_back({"7 experts, top-1, sigmoid", 7, 1, c, false, false});
  c = base(16);
  c.softmax_after_topk = 1;
  c.scaling_factor = 1.5f;
  cases.push_back({"384 experts, top-16, softmax after", 384, 16, c, true, false});
  // Sigmoid scores with no bias, groups or losses: the device takes the top k from the logits'
  // order (falling back where scores tie or nearly tie); bf16 logits tie often.
  c = base(8);
  c.score = SFMOE_ROUTER_SCORE_SIGMOID;
  c.normalize = 1;
  cases.push_back({"sigmoid top-8, normalize, 256 experts (logit order)", 256, 8, c, false, false});
  c = base(4);
  c.score = SFMOE_ROUTER_SCORE_SIGMOID;
  c.scaling_factor = 2.0f;
  cases.push_back({"sigmoid top-4, 64 experts, bf16 (logit order)", 64, 4, c, false, true});
  return cases;
}

// One router problem run through the API on `m`.
struct RouterRun {
  Twin<int32_t> ids;
  Twin<float> probs, aux, z, d_logits;
  Twin<int64_t> counts;
  RouterRun(int64_t tokens, int64_t experts, int64_t k)
      : ids(tokens * k, -5),
        probs(tokens * k, -3.0f),
        aux(1, -1.0f),
        z(1, -1.0f),
        d_logits(tokens * experts, -9.0f),
        counts(experts, -1) {}
  // The forward's outputs on the device equal the host's.
  void expect_forward_same() const {
    EXPECT_TRUE(ids.same("topk_ids"));
    EXPECT_TRUE(probs.same("probs"));
    EXPECT_TRUE(counts.same("tokens_per_expert"));
  }
};

// Relative agreement of two float arrays: |a - b| <= atol + rtol |b| everywhere (NaN with NaN).
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 double rtol, double atol, const char* what) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    if (std::isinf(want[i]) && got[i] == want[i]) continue;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaRouter, IdsProbabilitiesAndCountsEqualTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 11);
  const int64_t tokens = 4097;
  for (const RouterCase& rc : router_cases()) {
    SCOPED_TRACE(rc.name);
    const int64_t E = rc.experts, k = rc.top_k;
    std::vector<float> logits = make_logits(rng, tokens, E, true);
    std::vector<uint16_t> logits_bf16(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) logits_bf16[i] = numerics::f32_to_bf16(logits[i]);
    // The bias starves a few experts outright (they must get 0 tokens) and nudges the rest.
    std::vector<float> bias(E);
    for (int64_t e = 0; e < E; ++e)
      bias[e] = e % 17 == 3 ? -1e6f : 0.01f * static_cast<float>(rng() % 100);
    Twin<float> t_logits(logits), t_bias(bias);
    Twin<uint16_t> t_logits_bf16(logits_bf16);
    Twin<float> workspace(static_cast<size_t>((sfmoe_router_workspace_bytes(tokens, E) / 4)), 0.0f);
    RouterRun run(tokens, E, k);
    const sfmoe_dtype dtype = rc.bf16 ? SFMOE_DTYPE_BF16 : SFMOE_DTYPE_FP32;
    for (sfmoe_memory m : kBoth) {
      void* x = rc.bf16 ? static_cast<void*>(t_logits_bf16.on(m)) : t_logits.on(m);
      const sfmoe_tensor l = tensor_in(m, x, dtype, {tokens, E});
      const sfmoe_tensor b = tensor_in(m, t_bias.on(m), SFMOE_DTYPE_FP32, {E});
      const sfmoe_tensor ids = tensor_in(m, run.ids.on(m), SFMOE_DTYPE_INT32, {tokens, k});
      const sfmoe_tensor probs = tensor_in(m, run.probs.on(m), SFMOE_DTYPE_FP32, {tokens, k});
      const sfmoe_tensor counts = tensor_in(m, run.counts.on(m), SFMOE_DTYPE_INT64, {E});
      const sfmoe_tensor aux = tensor_in(m, run.aux.on(m), SFMOE_DTYPE_FP32, {1});
      const sfmoe_tensor z = tensor_in(m, run.z.on(m), SFMOE_DTYPE_FP32, {1});
      const sfmoe_tensor ws = tensor_in(m, workspace.on(m), SFMOE_DTYPE_FP32,
                                        {static_cast<int64_t>(workspace.host.size())});
      ASSERT_EQ(sfmoe_router_forward(&l, rc.bias ? &b : nullptr, &rc.config, &ids, &probs, &counts,
                                     rc.config.aux_loss_coeff != 0.0f ? &aux : nullptr,
                                     rc.config.z_loss_coeff != 0.0f ? &z : nullptr, &ws, nullptr),
                SFMOE_SUCCESS)
          << sfmoe_last_error();
    }
    CUDA_OK(cudaDeviceSynchronize());
    run.expect_forward_same();
    int64_t idle = 0;
    for (int64_t v : run.counts.host) idle += v == 0;
    if (rc.bias && E >= 17 * 2) EXPECT_GT(idle, 0) << "starved experts receive no tokens";

    // Backward: d logits within FP32 reassociation tolerances of the CPU's. Logits without NaN or
    // Inf here (those make the gradients NaN wherever they reach, on both sides).
    std::vector<float> finite = make_logits(rng, tokens, E, false);
    Twin<float> t_finite(finite);
    std::vector<float> dp(tokens * k);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : dp) v = normal(rng);
    Twin<float> t_dp(dp);
    RouterRun again(tokens, E, k);
    for (sfmoe_memory m : kBoth) {
      const sfmoe_tensor l = tensor_in(m, t_finite.on(m), SFMOE_DTYPE_FP32, {tokens, E});
      const sfmoe_tensor b = tensor_in(m, t_bias.on(m), SFMOE_DTYPE_FP32, {E});
      const sfmoe_tensor ids = tensor_in(m, again.ids.on(m), SFMOE_DTYPE_INT32, {tokens, k});
      const sfmoe_tensor probs = tensor_in(m, again.probs.on(m), SFMOE_DTYPE_FP32, {tokens, k});
      const sfmoe_tensor counts = tensor_in(m, again.counts.on(m), SFMOE_DTYPE_INT64, {E});
      const sfmoe_tensor aux = tensor_in(m, again.aux.on(m), SFMOE_DTYPE_FP32, {1});
      const sfmoe_tensor z = tensor_in(m, again.z.on(m), SFMOE_DTYPE_FP32, {1});
      const sfmoe_tensor ws = tensor_in(m, workspace.on(m), SFMOE_DTYPE_FP32,
                                        {static_cast<int64_t>(workspace.host.size())});
      const sfmoe_tensor d = tensor_in(m, t_dp.on(m), SFMOE_DTYPE_FP32, {tokens, k});
      const sfmoe_tensor dl = tensor_in(m, again.d_logits.on(m), SFMOE_DTYPE_FP32, {tokens, E});
      ASSERT_EQ(sfmoe_router_forward(&l, rc.bias ? &b : nullptr, &rc.config, &ids, &probs, &counts,
                                     &aux, &z, &ws, nullptr),
                SFMOE_SUCCESS)
          << sfmoe_last_error();
      ASSERT_EQ(sfmoe_router_backward(&l, &ids, &counts, &rc.config, &d, 1.0f, 1.0f, &dl, nullptr,
                                      nullptr),
                SFMOE_SUCCESS)
          << sfmoe_last_error();
    }
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(again.ids.same("topk_ids (finite logits)"));
    // Losses (on finite logits: a NaN loss would pass any comparison): sums over the tokens in
    // another order, within the reassociation bound of a T-term sum, T 2^-24 relative.
    ASSERT_TRUE(std::isfinite(again.aux.host[0]) && std::isfinite(again.z.host[0]));
    const double sum_bound = static_cast<double>(tokens) * std::ldexp(1.0, -24);
    EXPECT_TRUE(close(again.aux.device.download(), again.aux.host, sum_bound, 0.0, "aux_loss"));
    EXPECT_TRUE(close(again.z.device.download(), again.z.host, sum_bound, 0.0, "z_loss"));
    double scale = 0.0;
    for (float v : again.d_logits.host) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    EXPECT_TRUE(close(again.d_logits.device.download(), again.d_logits.host, 1e-4, 1e-6 * scale,
                      "d_logits"));
    std::printf("[ router ] %s: T=%lld, ids/probs/counts bit-exact, losses and d logits close\n",
                rc.name.c_str(), static_cast<long long>(tokens));
  }
}

// Softmax after top-k with non-finite selected logits: the backward follows the forward's limits
// (the +Inf logits share the probability, all -Inf gives uniform shares), so its gradients are
// finite where the CPU reference's are, and close to them.
// The logit-order top-k at the sigmoid's one-ulp dips (tests/cpp/test_numerics.cpp): x and the
// float below it score in the opposite order, so where the pair sits at the k-th place, or inside
// the top k, the logit order alone would pick wrongly; the device must fall back there and give
// the CPU backend's ids and probabilities. Also pairs of equal and of neighbouring logits.
TEST(CudaRouter, LogitOrderTopKAtSigmoidDipsAndTies) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 22);
  // A dip: the first float above 0.0615 whose sigmoid is below its predecessor's.
  uint32_t dip = numerics::f32_to_bits(0.0615f);
  while (numerics::sigmoid_f32(numerics::bits_to_f32(dip)) >=
         numerics::sigmoid_f32(numerics::bits_to_f32(dip - 1))) {
    ++dip;
  }
  const float high = numerics::bits_to_f32(dip), low = numerics::bits_to_f32(dip - 1);
  const int64_t tokens = 512, E = 64, k = 6;
  std::vector<float> logits(tokens * E);
  std::normal_distribution<float> normal(-3.0f, 0.5f);
  for (float& v : logits) v = normal(rng);
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = &logits[t * E];
    // `place` experts far above, then the pair: the pair takes places place and place + 1.
    const int64_t place = t % (k + 1);
    for (int64_t i = 0; i < place; ++i) row[(t + 7 * i) % E] = 4.0f + static_cast<float>(i);
    const int64_t a = (t * 13 + 5) % E, b = (a + 1 + static_cast<int64_t>(rng() % (E - 1))) % E;
    switch ((t / (k + 1)) % 4) {
      case 0:
        row[a] = high, row[b] = low;
        break;  // the dip
      case 1:
        row[a] = low, row[b] = high;
        break;  // the dip, indices swapped
      case 2:
        row[a] = high, row[b] = high;
        break;  // equal logits
      default:
        row[a] = 0.5f, row[b] = std::nextafter(0.5f, 1.0f);
        break;  // neighbours
    }
  }
  sfmoe_router_config c = sfmoe_router_config_init();
  c.top_k = k;
  c.score = SFMOE_ROUTER_SCORE_SIGMOID;
  c.normalize = 1;
  Twin<float> t_logits(logits);
  RouterRun run(tokens, E, k);
  for (sfmoe_memory m : kBoth) {
    const sfmoe_tensor l = tensor_in(m, t_logits.on(m), SFMOE_DTYPE_FP32, {tokens, E});
    const sfmoe_tensor ids = tensor_in(m, run.ids.on(m), SFMOE_DTYPE_INT32, {tokens, k});
    const sfmoe_tensor probs = tensor_in(m, run.probs.on(m), SFMOE_DTYPE_FP32, {tokens, k});
    const sfmoe_tensor counts = tensor_in(m, run.counts.on(m), SFMOE_DTYPE_INT64, {E});
    ASSERT_EQ(sfmoe_router_forward(&l, nullptr, &c, &ids, &probs, &counts, nullptr, nullptr,
                                   nullptr, nullptr),
              SFMOE_SUCCESS)
        << sfmoe_last_error();
  }
  CUDA_OK(cudaDeviceSynchronize());
  run.expect_forward_same();
  std::printf(
      "[ router ] logit-order top-k at a sigmoid dip (x = %a), equal and neighbouring "
      "logits at every place up to k: bit-exact vs CPU\n",
      static_cast<double>(high));
}

TEST(CudaRouter, SoftmaxAfterTopKBackwardWithInfiniteLogits) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 17);
  const int64_t tokens = 64, E = 16, k = 4;
  std::vector<float> logits = make_logits(rng, tokens, E, false);
  for (int64_t t = 0; t < tokens; t += 4) logits[t * E + rng() % E] = INFINITY;
  for (int64_t t = 1; t < tokens; t += 8)
    logits[t * E + rng() % E] = INFINITY, logits[t * E + 3] = INFINITY;
  for (int64_t e = 0; e < E; ++e) logits[2 * E + e] = -INFINITY;
  sfmoe_router_config c = sfmoe_router_config_init();
  c.top_k = k;
  c.softmax_after_topk = 1;
  Twin<float> t_logits(logits), d_probs(tokens * k, 0.0f);
  for (float& v : d_probs.host) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  CUDA_OK(d_probs.device.upload(d_probs.host));
  RouterRun run(tokens, E, k);
  for (sfmoe_memory m : kBoth) {
    const sfmoe_tensor l = tensor_in(m, t_logits.on(m), SFMOE_DTYPE_FP32, {tokens, E});
    const sfmoe_tensor ids = tensor_in(m, run.ids.on(m), SFMOE_DTYPE_INT32, {tokens, k});
    const sfmoe_tensor probs = tensor_in(m, run.probs.on(m), SFMOE_DTYPE_FP32, {tokens, k});
    const sfmoe_tensor counts = tensor_in(m, run.counts.on(m), SFMOE_DTYPE_INT64, {E});
    const sfmoe_tensor dp = tensor_in(m, d_probs.on(m), SFMOE_DTYPE_FP32, {tokens, k});
    const sfmoe_tensor dl = tensor_in(m, run.d_logits.on(m), SFMOE_DTYPE_FP32, {tokens, E});
    ASSERT_EQ(sfmoe_router_forward(&l, nullptr, &c, &ids, &probs, &counts, nullptr, nullptr,
                                   nullptr, nullptr),
              SFMOE_SUCCESS)
        << sfmoe_last_error();
    ASSERT_EQ(sfmoe_router_backward(&l, &ids, &counts, &c, &dp, 0.0f, 0.0f, &dl, nullptr, nullptr),
              SFMOE_SUCCESS)
        << sfmoe_last_error();
  }
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(run.ids.same("topk_ids"));
  EXPECT_TRUE(run.probs.same("probs"));
  for (float v : run.d_logits.host) ASSERT_TRUE(std::isfinite(v));
  EXPECT_TRUE(close(run.d_logits.device.download(), run.d_logits.host, 1e-4, 1e-6, "d_logits"));
}

// A backward given an id that is no expert skips it and says so in the status word.
TEST(CudaRouter, BadIdsInTheBackwardAreSkippedAndReported) {
  SFMOE_SKIP_WITHOUT_GPU();
  const int64_t tokens = 33, E = 16, k = 2;
  sfmoe_router_config c = sfmoe_router_config_init();
  c.top_k = k;
  std::vector<float> logits(tokens * E, 0.25f);
  std::vector<int32_t> ids(tokens * k);
  for (int64_t i = 0; i < tokens * k; ++i) ids[i] = static_cast<int32_t>(i % E);
  ids[7] = 99;
  DeviceBuffer<float> d_logits(tokens * E), x(tokens * E), dp(tokens * k);
  DeviceBuffer<int32_t> d_ids(tokens * k);
  DeviceBuffer<int64_t> counts(E);
  CUDA_OK(x.upload(logits));
  CUDA_OK(d_ids.upload(ids));
  CUDA_OK(dp.upload(std::vector<float>(tokens * k, 1.0f)));
  CUDA_OK(counts.upload(std::vector<int64_t>(E, 4)));
  sfmoe_status_word* word = nullptr;
  ASSERT_EQ(sfmoe_status_word_create(SFMOE_MEMORY_CUDA, 0, &word), SFMOE_SUCCESS);
  const sfmoe_tensor l = tensor_in(SFMOE_MEMORY_CUDA, x.ptr, SFMOE_DTYPE_FP32, {tokens, E});
  const sfmoe_tensor t_ids =
      tensor_in(SFMOE_MEMORY_CUDA, d_ids.ptr, SFMOE_DTYPE_INT32, {tokens, k});
  const sfmoe_tensor t_counts = tensor_in(SFMOE_MEMORY_CUDA, counts.ptr, SFMOE_DTYPE_INT64, {E});
  const sfmoe_tensor t_dp = tensor_in(SFMOE_MEMORY_CUDA, dp.ptr, SFMOE_DTYPE_FP32, {tokens, k});
  const sfmoe_tensor t_dl =
      tensor_in(SFMOE_MEMORY_CUDA, d_logits.ptr, SFMOE_DTYPE_FP32, {tokens, E});
  ASSERT_EQ(
      sfmoe_router_backward(&l, &t_ids, &t_counts, &c, &t_dp, 0.0f, 0.0f, &t_dl, word, nullptr),
      SFMOE_SUCCESS);
  ASSERT_EQ(sfmoe_status_word_snapshot(word, nullptr), SFMOE_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  sfmoe_fault_report report;
  ASSERT_EQ(sfmoe_status_word_read(word, &report), SFMOE_SUCCESS);
  EXPECT_TRUE(report.flags & SFMOE_FAULT_BAD_INDEX);
  EXPECT_EQ(report.first_group, 3);  // the token
  EXPECT_EQ(report.first_value, 99);
  for (float v : d_logits.download()) ASSERT_TRUE(std::isfinite(v));
  sfmoe_status_word_destroy(word);
}

// Per-group FP8 scales as a delayed-scaling recipe would give them: powers of two and arbitrary
// values across a wide range (so some groups saturate and some underflow), one of them 1, and
// the values a broken history can hold (Inf, NaN, 0, negative, subnormal: the padding rows'
// codes are then fp8(0 * s), NaN for Inf or NaN).
std::vector<float> given_tensor_scales(std::mt19937_64& rng, int64_t groups) {
  std::uniform_real_distribution<float> exponent(-6.0f, 12.0f);
  const float specials[] = {INFINITY, NAN, 0.0f, -2.0f, 1e-40f};
  std::vector<float> v(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const float e = exponent(rng);
    v[g] = g == 0 ? 1.0f : (g % 3 == 1 ? std::exp2(std::floor(e)) : std::exp2(e));
    if (g >= 2 && g < 7) v[g] = specials[g - 2];
  }
  return v;
}

// ---- permute / unpermute ------------------------------------------------------------------------

// Ids as the router writes them: k distinct experts per token.
std::vector<int32_t> make_ids(std::mt19937_64& rng, int64_t tokens, int64_t experts, int64_t k) {
  std::vector<int32_t> ids(tokens * k);
  std::vector<int32_t> all(experts);
  for (int64_t e = 0; e < experts; ++e) all[e] = static_cast<int32_t>(e);
  for (int64_t t = 0; t < tokens; ++t) {
    // Skewed: low ids are picked far more often; expert E - 1 never (an empty group).
    for (int64_t i = 0; i < k; ++i) {
      int32_t e;
      bool fresh;
      do {
        const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
        e = static_cast<int32_t>(std::floor(std::pow(u, 2.0) * (experts - 1)));
        fresh = std::find(&ids[t * k], &ids[t * k + i], e) == &ids[t * k + i];
      } while (!fresh);
      ids[t * k + i] = e;
    }
  }
  return ids;
}

// Row values of any of the three dtypes with the special values in the mix, as raw codes.
std::vector<uint8_t> make_rows(std::mt19937_64& rng, int64_t count, sfmoe_dtype dtype) {
  const int bytes = sfmoe_dtype_bits(dtype) / 8;
  std::vector<uint8_t> out(static_cast<size_t>(count * bytes));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<uint32_t> special = special_f32_bits();
  for (int64_t i = 0; i < count; ++i) {
    float v = normal(rng);
    if (rng() % 200 == 0) v = numerics::bits_to_f32(special[rng() % special.size()]);
    const uint32_t code = dtype == SFMOE_DTYPE_FP32   ? numerics::f32_to_bits(v)
                          : dtype == SFMOE_DTYPE_BF16 ? numerics::f32_to_bf16(v)
                                                      : numerics::f32_to_fp16(v);
    std::memcpy(&out[static_cast<size_t>(i) * bytes], &code, bytes);
  }
  return out;
}

struct PermuteCase {
  sfmoe_dtype dtype;
  int64_t hidden, alignment, capacity;
};

TEST(CudaPermute, PermuteUnpermuteAndBackwardEqualTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 12);
  const int64_t tokens = 4097, E = 256, k = 8;
  const PermuteCase cases[] = {{SFMOE_DTYPE_BF16, 264, 16, 0}, {SFMOE_DTYPE_BF16, 264, 128, 0},
                               {SFMOE_DTYPE_BF16, 33, 1, 0},   {SFMOE_DTYPE_FP32, 40, 32, 100},
                               {SFMOE_DTYPE_FP16, 72, 8, 37},  {SFMOE_DTYPE_FP32, 7, 64, 0}};
  int checked = 0;
  for (const PermuteCase& pc : cases) {
    const int64_t H = pc.hidden, a = pc.alignment, bytes = sfmoe_dtype_bits(pc.dtype) / 8;
    SCOPED_TRACE(std::string(sfmoe_dtype_name(pc.dtype)) + " H=" + std::to_string(H) +
                 " alignment=" + std::to_string(a) + " capacity=" + std::to_string(pc.capacity));
    const int64_t kept_bound = pc.capacity > 0 ? std::min(tokens * k, E * pc.capacity) : tokens * k;
    const int64_t capacity_rows = kept_bound + E * (a - 1) + 3;
    Twin<uint8_t> x(make_rows(rng, tokens * H, pc.dtype));
    Twin<int32_t> ids(make_ids(rng, tokens, E, k));
    Twin<uint8_t> rows(static_cast<size_t>(capacity_rows * H * bytes), 0xA5);
    Twin<int64_t> offsets(E + 1, -9), row_map(tokens * k, -7), kept(E, -1), dropped(E, -1);
    Twin<float> amax(E, -5.0f);  // each expert's amax of its kept rows
    sfmoe_permute_config config = sfmoe_permute_config_init();
    config.expert_capacity = pc.capacity;
    Twin<int32_t> workspace(static_cast<size_t>((sfmoe_permute_workspace_bytes(tokens, E) / 4)), 0);
    // Rows of a multiple of 16 bytes move by the bulk copy placing its own token's slots, the
    // others (H = 33 BF16, H = 7 FP32) by the place kernel and the vector copy.
    for (sfmoe_memory m : kBoth) {
      const sfmoe_tensor t_ws = tensor_in(m, workspace.on(m), SFMOE_DTYPE_INT32,
                                          {static_cast<int64_t>(workspace.host.size())});
      const sfmoe_tensor t_x = tensor_in(m, x.on(m), pc.dtype, {tokens, H});
      const sfmoe_tensor t_ids = tensor_in(m, ids.on(m), SFMOE_DTYPE_INT32, {tokens, k});
      sfmoe_grouped_tensor g =
          rows_in(m, rows.on(m), pc.dtype, E, capacity_rows, H, a, offsets.on(m));
      g.amax = amax.on(m);
      const sfmoe_tensor t_map = tensor_in(m, row_map.on(m), SFMOE_DTYPE_INT64, {tokens, k});
      const sfmoe_tensor t_kept = tensor_in(m, kept.on(m), SFMOE_DTYPE_INT64, {E});
      const sfmoe_tensor t_dropped = tensor_in(m, dropped.on(m), SFMOE_DTYPE_INT64, {E});
      ASSERT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &g, &t_map, &t_kept, &t_dropped, &t_ws,
                              nullptr, nullptr),
                SFMOE_SUCCESS)
          << sfmoe_last_error();
    }
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(rows.same("permuted rows (whole buffer)"));
    EXPECT_TRUE(offsets.same("group offsets"));
    EXPECT_TRUE(row_map.same("row_map"));
    EXPECT_TRUE(kept.same("tokens_per_expert"));
    EXPECT_TRUE(dropped.same("dropped_per_expert"));
    EXPECT_TRUE(amax.same("each expert's amax"));
    EXPECT_EQ(kept.host[E - 1], 0);
    EXPECT_EQ(amax.host[E - 1], 0.0f) << "an expert without rows";

    // Unpermute into each output dtype, with and without probabilities.
    std::vector<float> p(tokens * k);
    for (float& v : p) v = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    p[5] = -0.0f;
    Twin<float> probs(p);
    for (sfmoe_dtype out_dtype : {SFMOE_DTYPE_FP32, SFMOE_DTYPE_BF16}) {
      for (bool weighted : {true, false}) {
        const int64_t out_bytes = sfmoe_dtype_bits(out_dtype) / 8;
        Twin<uint8_t> out(static_cast<size_t>(tokens * H * out_bytes), 0x5A);
        for (sfmoe_memory m : kBoth) {
          const sfmoe_grouped_tensor g =
              rows_in(m, rows.on(m), pc.dtype, E, capacity_rows, H, a, offsets.on(m));
          const sfmoe_tensor t_map = tensor_in(m, row_map.on(m), SFMOE_DTYPE_INT64, {tokens, k});
          const sfmoe_tensor t_p = tensor_in(m, probs.on(m), SFMOE_DTYPE_FP32, {tokens, k});
          const sfmoe_tensor t_out = tensor_in(m, out.on(m), out_dtype, {tokens, H});
          ASSERT_EQ(
              sfmoe_unpermute(&g, &t_map, weighted ? &t_p : nullptr, &t_out, nullptr, nullptr),
              SFMOE_SUCCESS)
              << sfmoe_last_error();
        }
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_TRUE(out.same(weighted ? "unpermute (weighted)" : "unpermute (permute's backward)"));
      }
    }

    // Unpermute's backward: d_rows bit for bit (one product each), d_probs within reassociation.
    Twin<uint8_t> d_out(make_rows(rng, tokens * H, pc.dtype));
    Twin<uint8_t> d_rows(static_cast<size_t>(capacity_rows * H * 4), 0xC3);
    Twin<float> d_probs(tokens * k, -2.0f);
    for (sfmoe_memory m : kBoth) {
      const sfmoe_tensor t_dout = tensor_in(m, d_out.on(m), pc.dtype, {tokens, H});
      const sfmoe_grouped_tensor g =
          rows_in(m, rows.on(m), pc.dtype, E, capacity_rows, H, a, offsets.on(m));
      const sfmoe_grouped_tensor dg =
          rows_in(m, d_rows.on(m), SFMOE_DTYPE_FP32, E, capacity_rows, H, a, offsets.on(m));
      const sfmoe_tensor t_map = tensor_in(m, row_map.on(m), SFMOE_DTYPE_INT64, {tokens, k});
      const sfmoe_tensor t_p = tensor_in(m, probs.on(m), SFMOE_DTYPE_FP32, {tokens, k});
      const sfmoe_tensor t_kept = tensor_in(m, kept.on(m), SFMOE_DTYPE_INT64, {E});
      const sfmoe_tensor t_dp = tensor_in(m, d_probs.on(m), SFMOE_DTYPE_FP32, {tokens, k});
      ASSERT_EQ(sfmoe_unpermute_backward(&t_dout, &g, &t_map, &t_p, &t_kept, &dg, &t_dp, nullptr,
                                         nullptr),
                SFMOE_SUCCESS)
          << sfmoe_last_error();
    }
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(d_rows.same("d_rows (whole buffer)"));
    // Dots of H products with specials in the mix: NaN/Inf where the reference has them, else
    // within the two FP32 sums' reassociation bound, 2 H u of the slot's magnitude sum
    // sum |d_out x row| (cancellation can make the dot itself much smaller than that).
    const std::vector<float> got = d_probs.device.download();
    auto value = [&](const std::vector<uint8_t>& bytes_of, int64_t index) {
      uint32_t code = 0;
      std::memcpy(&code, &bytes_of[static_cast<size_t>(index * bytes)], static_cast<size_t>(bytes));
      return pc.dtype == SFMOE_DTYPE_FP32   ? numerics::bits_to_f32(code)
             : pc.dtype == SFMOE_DTYPE_BF16 ? numerics::bf16_to_f32(static_cast<uint16_t>(code))
                                            : numerics::fp16_to_f32(static_cast<uint16_t>(code));
    };
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = d_probs.host[i];
      if (!std::isfinite(want)) {
        EXPECT_TRUE(std::isnan(want) ? std::isnan(got[i]) : got[i] == want) << i;
        continue;
      }
      const int64_t t = static_cast<int64_t>(i) / k, row = row_map.host[i];
      double magnitude = 0.0;
      for (int64_t h = 0; row >= 0 && h < H; ++h) {
        magnitude += std::fabs(static_cast<double>(value(d_out.host, t * H + h)) *
                               static_cast<double>(value(rows.host, row * H + h)));
      }
      ASSERT_NEAR(got[i], want, 2.0 * H * 6e-8 * magnitude + 1e-30)
          << "d_probs[" << i << "], magnitude sum " << magnitude;
    }
    ++checked;
  }
  std::printf(
      "[ permute ] %d cases (T=4097, E=256, k=8, skewed, an idle expert): permute, "
      "unpermute x4, backward bit-exact vs CPU\n",
      checked);
}

// Rows longer than one bulk-copy segment (32 KiB) move in several segments, padding rows
// included (FP32, H = 8204: 32,816-byte rows); rows of H = 8203 (32,812 bytes, not a multiple of
// 16) move by the vector copy in 4-byte vectors. Both against the CPU backend, over poisoned
// buffers.
TEST(CudaPermute, LongRowsMoveInSegmentsByEitherCopy) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 21);
  const int64_t tokens = 37, E = 8, k = 2, a = 8;
  const int64_t capacity_rows = tokens * k + E * (a - 1) + 3;
  Twin<int32_t> ids(make_ids(rng, tokens, E, k));
  int checked = 0;
  for (const int64_t H : {int64_t{8204}, int64_t{8203}}) {
    SCOPED_TRACE(H == 8204 ? "bulk copy, H = 8204" : "vector copy, H = 8203");
    Twin<uint8_t> x(make_rows(rng, tokens * H, SFMOE_DTYPE_FP32));
    Twin<uint8_t> rows(static_cast<size_t>(capacity_rows * H * 4), 0xA5);
    Twin<int64_t> offsets(E + 1, -9), row_map(tokens * k, -7), kept(E, -1);
    Twin<float> amax(E, -5.0f);
    Twin<int32_t> workspace(static_cast<size_t>((sfmoe_permute_workspace_bytes(tokens, E) / 4)), 0);
    sfmoe_permute_config config = sfmoe_permute_config_init();
    for (sfmoe_memory m : kBoth) {
      const sfmoe_tensor t_ws = tensor_in(m, workspace.on(m), SFMOE_DTYPE_INT32,
                                          {static_cast<int64_t>(workspace.host.size())});
      const sfmoe_tensor t_x = tensor_in(m, x.on(m), SFMOE_DTYPE_FP32, {tokens, H});
      const sfmoe_tensor t_ids = tensor_in(m, ids.on(m), SFMOE_DTYPE_INT32, {tokens, k});
      sfmoe_grouped_tensor g =
          rows_in(m, rows.on(m), SFMOE_DTYPE_FP32, E, capacity_rows, H, a, offsets.on(m));
      g.amax = amax.on(m);
      const sfmoe_tensor t_map = tensor_in(m, row_map.on(m), SFMOE_DTYPE_INT64, {tokens, k});
      const sfmoe_tensor t_kept = tensor_in(m, kept.on(m), SFMOE_DTYPE_INT64, {E});
      ASSERT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &g, &t_map, &t_kept, nullptr, &t_ws, nullptr,
                              nullptr),
                SFMOE_SUCCESS)
          << sfmoe_last_error();
    }
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(rows.same("permuted rows (whole buffer)"));
    EXPECT_TRUE(row_map.same("row_map"));
    EXPECT_TRUE(amax.same("each expert's amax (over both segments)"));
    ++checked;
  }
  std::printf(
      "[ permute ] 32,816-byte rows (2 bulk segments) and 32,812-byte rows (vector copy): %d cases "
      "bit-exact vs CPU\n",
      checked);
}

// Permute into quantized rows (the fused quantization) against the CPU backend's definition
// (permute, then the grouped quantization of the rows), byte for byte over poisoned buffers: codes,
// scales in both layouts, offsets, row map.
TEST(CudaPermute, FusedQuantizationEqualsTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 15);
  const int64_t tokens = 4097, E = 256, k = 8;
  struct Fused {
    sfmoe_scaling scaling;
    sfmoe_dtype dtype, in_dtype;
    sfmoe_scale_layout layout;
    bool pow2;
    int64_t hidden, alignment, capacity;
  };
  const Fused cases[] = {
      {SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_BF16, SFMOE_SCALE_LAYOUT_COMPACT,
       false, 256, 32, 0},
      {SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E5M2, SFMOE_DTYPE_FP32, SFMOE_SCALE_LAYOUT_SWIZZLED,
       false, 96, 128, 0},
      {SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_BF16, SFMOE_SCALE_LAYOUT_SWIZZLED,
       false, 256, 128, 60},
      {SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_BF16,
       SFMOE_SCALE_LAYOUT_COMPACT, false, 384, 16, 0},
      {SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E5M2, SFMOE_DTYPE_FP16,
       SFMOE_SCALE_LAYOUT_COMPACT, true, 128, 1, 50},
      // Per-tensor FP8 with given scales (one per expert; some saturate, some are tiny).
      {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_BF16, SFMOE_SCALE_LAYOUT_COMPACT,
       false, 264, 16, 0},
      {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E5M2, SFMOE_DTYPE_FP32, SFMOE_SCALE_LAYOUT_COMPACT,
       false, 40, 1, 40},
  };
  int checked = 0;
  for (const Fused& fc : cases) {
    const int64_t H = fc.hidden, a = fc.alignment;
    SCOPED_TRACE(std::string(sfmoe_scaling_name(fc.scaling)) + " " + sfmoe_dtype_name(fc.dtype) +
                 " H=" + std::to_string(H) + " alignment=" + std::to_string(a));
    const int64_t kept_bound = fc.capacity > 0 ? std::min(tokens * k, E * fc.capacity) : tokens * k;
    const int64_t R = kept_bound + E * (a - 1) + 5;
    int32_t ndim = 0;
    int64_t scale_shape[2] = {1, 1};
    ASSERT_EQ(sfmoe_scale_shape(fc.scaling, fc.layout, E, R, H, &ndim, scale_shape), SFMOE_SUCCESS);
    const int64_t scale_bytes = scale_shape[0] * (ndim == 2 ? scale_shape[1] : 1) *
                                (fc.scaling == SFMOE_SCALING_MX_1X32 ? 1 : 4);
    const bool tensor = fc.scaling == SFMOE_SCALING_TENSOR;
    Twin<float> given(given_tensor_scales(rng, E)), amax(E, -1.0f);
    Twin<uint8_t> x(make_rows(rng, tokens * H, fc.in_dtype));
    Twin<int32_t> ids(make_ids(rng, tokens, E, k));
    Twin<uint8_t> codes(static_cast<size_t>(R * H), 0xA5),
        scales(static_cast<size_t>(scale_bytes), 0x5A);
    Twin<int64_t> offsets(E + 1, -9), row_map(tokens * k, -7), kept(E, -1), dropped(E, -1);
    Twin<int32_t> workspace(static_cast<size_t>((sfmoe_permute_workspace_bytes(tokens, E) / 4)), 0);
    sfmoe_quantize_config qc = sfmoe_quantize_config_init();
    qc.power_of_two_scales = fc.pow2;
    sfmoe_permute_config config = sfmoe_permute_config_init();
    config.expert_capacity = fc.capacity;
    config.quantize = &qc;
    for (sfmoe_memory m : kBoth) {
      const sfmoe_tensor t_x = tensor_in(m, x.on(m), fc.in_dtype, {tokens, H});
      const sfmoe_tensor t_ids = tensor_in(m, ids.on(m), SFMOE_DTYPE_INT32, {tokens, k});
      sfmoe_grouped_tensor g = rows_in(m, codes.on(m), fc.dtype, E, R, H, a, offsets.on(m));
      g.scaling = fc.scaling;
      g.scale_layout = fc.layout;
      g.rowwise_scale_inv = scales.on(m);
      if (tensor) {
        g.amax = amax.on(m);
        qc.tensor_scales = given.on(m);
      }
      const sfmoe_tensor t_map = tensor_in(m, row_map.on(m), SFMOE_DTYPE_INT64, {tokens, k});
      const sfmoe_tensor t_kept = tensor_in(m, kept.on(m), SFMOE_DTYPE_INT64, {E});
      const sfmoe_tensor t_dropped = tensor_in(m, dropped.on(m), SFMOE_DTYPE_INT64, {E});
      const sfmoe_tensor t_ws = tensor_in(m, workspace.on(m), SFMOE_DTYPE_INT32,
                                          {static_cast<int64_t>(workspace.host.size())});
      ASSERT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &g, &t_map, &t_kept, &t_dropped, &t_ws,
                              nullptr, nullptr),
                SFMOE_SUCCESS)
          << sfmoe_last_error();
    }
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(codes.same("codes (whole buffer)"));
    EXPECT_TRUE(scales.same("scales (whole buffer)"));
    if (tensor) EXPECT_TRUE(amax.same("group amax"));
    EXPECT_TRUE(offsets.same("group offsets"));
    EXPECT_TRUE(row_map.same("row_map"));
    EXPECT_TRUE(kept.same("tokens_per_expert"));
    ++checked;
  }
  std::printf(
      "[ permute ] %d fused-quantization cases (mxfp8 compact/swizzled, fp8 1x128, pow2, "
      "fp8 per-tensor with given scales, capacity): bit-exact vs CPU\n",
      checked);
}

TEST(CudaPermute, BadIdsAreSkippedAndReported) {
  SFMOE_SKIP_WITHOUT_GPU();
  const int64_t tokens = 40, E = 8, k = 2, H = 16, a = 8;
  std::vector<int32_t> ids(tokens * k);
  for (int64_t i = 0; i < tokens * k; ++i) ids[i] = static_cast<int32_t>(i % E);
  ids[9] = -3;        // token 4: no expert
  ids[21] = ids[20];  // token 10: the same expert twice
  const int64_t capacity_rows = tokens * k + E * (a - 1);
  DeviceBuffer<uint16_t> x(tokens * H), rows(capacity_rows * H);
  DeviceBuffer<int32_t> d_ids(tokens * k);
  DeviceBuffer<int64_t> offsets(E + 1), map(tokens * k), kept(E);
  CUDA_OK(x.upload(std::vector<uint16_t>(tokens * H, 0x3F80)));
  CUDA_OK(d_ids.upload(ids));
  sfmoe_status_word* word = nullptr;
  ASSERT_EQ(sfmoe_status_word_create(SFMOE_MEMORY_CUDA, 0, &word), SFMOE_SUCCESS);
  const sfmoe_memory m = SFMOE_MEMORY_CUDA;
  const sfmoe_tensor t_x = tensor_in(m, x.ptr, SFMOE_DTYPE_BF16, {tokens, H});
  const sfmoe_tensor t_ids = tensor_in(m, d_ids.ptr, SFMOE_DTYPE_INT32, {tokens, k});
  const sfmoe_grouped_tensor g =
      rows_in(m, rows.ptr, SFMOE_DTYPE_BF16, E, capacity_rows, H, a, offsets.ptr);
  const sfmoe_tensor t_map = tensor_in(m, map.ptr, SFMOE_DTYPE_INT64, {tokens, k});
  const sfmoe_tensor t_kept = tensor_in(m, kept.ptr, SFMOE_DTYPE_INT64, {E});
  sfmoe_permute_config config = sfmoe_permute_config_init();
  DeviceBuffer<int32_t> ws((sfmoe_permute_workspace_bytes(tokens, E) / 4));
  const sfmoe_tensor t_ws =
      tensor_in(m, ws.ptr, SFMOE_DTYPE_INT32, {static_cast<int64_t>(ws.count)});
  ASSERT_EQ(
      sfmoe_permute(&t_x, &t_ids, &config, &g, &t_map, &t_kept, nullptr, &t_ws, word, nullptr),
      SFMOE_SUCCESS)
      << sfmoe_last_error();
  ASSERT_EQ(sfmoe_status_word_snapshot(word, nullptr), SFMOE_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  sfmoe_fault_report report;
  ASSERT_EQ(sfmoe_status_word_read(word, &report), SFMOE_SUCCESS);
  EXPECT_TRUE(report.flags & SFMOE_FAULT_BAD_INDEX);
  EXPECT_EQ(report.count, 2u);
  const std::vector<int64_t> got_map = map.download();
  EXPECT_EQ(got_map[9], -1);
  EXPECT_EQ(got_map[21], -1);
  EXPECT_GE(got_map[20], 0);
  int64_t total = 0;
  for (int64_t v : kept.download()) total += v;
  EXPECT_EQ(total, tokens * k - 2);
  sfmoe_status_word_destroy(word);
}

// ---- activations
// ----------------------------------------------------------------------------------

TEST(CudaActivation, EveryKindForwardAndBackwardEqualsTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 13);
  const sfmoe_activation kinds[] = {SFMOE_ACTIVATION_SWIGLU,       SFMOE_ACTIVATION_GEGLU,
                                    SFMOE_ACTIVATION_SILU,         SFMOE_ACTIVATION_GELU,
                                    SFMOE_ACTIVATION_SQUARED_RELU, SFMOE_ACTIVATION_CLAMPED_SWIGLU};
  struct Shape {
    sfmoe_dtype in, out;
    int64_t cols;
  };
  const Shape shapes[] = {{SFMOE_DTYPE_BF16, SFMOE_DTYPE_BF16, 264},
                          {SFMOE_DTYPE_FP32, SFMOE_DTYPE_BF16, 40},
                          {SFMOE_DTYPE_FP16, SFMOE_DTYPE_FP32, 37}};
  int checked = 0;
  for (sfmoe_activation kind : kinds) {
    for (const Shape& s : shapes) {
      const bool gated = kind == SFMOE_ACTIVATION_SWIGLU || kind == SFMOE_ACTIVATION_GEGLU ||
                         kind == SFMOE_ACTIVATION_CLAMPED_SWIGLU;
      const int64_t G = 12, a = 16, F = s.cols, in_cols = gated ? 2 * F : F;
      // Groups: 0, 1, 31, 33 and random real rows, each padded to the alignment.
      std::vector<int64_t> offsets(G + 1, 0), real(G);
      const int64_t fixed[] = {0, 1, 31, 33, 16};
      for (int64_t g = 0; g < G; ++g) {
        real[g] = g < 5 ? fixed[g] : static_cast<int64_t>(rng() % 90);
        offsets[g + 1] = offsets[g] + (real[g] + a - 1) / a * a;
      }
      const int64_t capacity = offsets[G] + 7;  // spare rows at the end stay untouched
      const int in_bytes = sfmoe_dtype_bits(s.in) / 8, out_bytes = sfmoe_dtype_bits(s.out) / 8;
      Twin<uint8_t> input(make_rows(rng, capacity * in_cols, s.in));
      Twin<uint8_t> d_output(make_rows(rng, capacity * F, s.out));
      Twin<uint8_t> output(static_cast<size_t>(capacity * F * out_bytes), 0xA5);
      Twin<uint8_t> d_input(static_cast<size_t>(capacity * in_cols * in_bytes), 0x5A);
      Twin<int64_t> t_offsets(offsets), out_offsets(G + 1, -4), rows(real);
      sfmoe_activation_config c = sfmoe_activation_config_init();
      c.kind = kind;
      for (sfmoe_memory m : kBoth) {
        const sfmoe_grouped_tensor in =
            rows_in(m, input.on(m), s.in, G, capacity, in_cols, a, t_offsets.on(m));
        const sfmoe_grouped_tensor out =
            rows_in(m, output.on(m), s.out, G, capacity, F, a, out_offsets.on(m));
        const sfmoe_grouped_tensor dout =
            rows_in(m, d_output.on(m), s.out, G, capacity, F, a, t_offsets.on(m));
        const sfmoe_grouped_tensor din =
            rows_in(m, d_input.on(m), s.in, G, capacity, in_cols, a, t_offsets.on(m));
        const sfmoe_tensor t_rows = tensor_in(m, rows.on(m), SFMOE_DTYPE_INT64, {G});
        ASSERT_EQ(sfmoe_grouped_activation(&in, &t_rows, &c, &out, nullptr, nullptr), SFMOE_SUCCESS)
            << sfmoe_last_error();
        ASSERT_EQ(
            sfmoe_grouped_activation_backward(&in, &t_rows, &dout, &c, &din, nullptr, nullptr),
            SFMOE_SUCCESS)
            << sfmoe_last_error();
      }
      CUDA_OK(cudaDeviceSynchronize());
      const std::string what = "kind " + std::to_string(kind) + " " + sfmoe_dtype_name(s.in) +
                               "->" + sfmoe_dtype_name(s.out) + " F=" + std::to_string(F);
      EXPECT_TRUE(output.same((what + " forward").c_str()));
      EXPECT_TRUE(out_offsets.same((what + " output offsets").c_str()));
      EXPECT_TRUE(d_input.same((what + " backward").c_str()));
      ++checked;
    }
  }
  std::printf("[ activation ] %d kind/dtype/width cases, forward and backward bit-exact vs CPU\n",
              checked);
}

// The MoE layer's internal forms, through the backend table on both backends: the weighted,
// in-place activation backward (d input over the input, the weighted activations over d output:
// bit-exact; each row's d weight, a sum whose order differs, within a tolerance), the gather form
// of unpermute's backward and the slot values (bit-exact).
TEST(CudaActivation, WeightedInPlaceBackwardEqualsTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 17);
  const ActivationKind kinds[] = {ActivationKind::kSwiGLU,      ActivationKind::kGeGLU,
                                  ActivationKind::kSiLU,        ActivationKind::kGeLU,
                                  ActivationKind::kSquaredReLU, ActivationKind::kClampedSwiGLU};
  int checked = 0;
  for (ActivationKind kind : kinds) {
    for (int64_t F : {264, 37, 768}) {
      const bool gated = activation_is_gated(kind);
      const int64_t G = 9, a = 16, in_cols = gated ? 2 * F : F;
      std::vector<int64_t> offsets(G + 1, 0), real(G);
      const int64_t fixed[] = {0, 1, 31, 33};
      for (int64_t g = 0; g < G; ++g) {
        real[g] = g < 4 ? fixed[g] : static_cast<int64_t>(rng() % 70);
        offsets[g + 1] = offsets[g] + (real[g] + a - 1) / a * a;
      }
      const int64_t capacity = offsets[G] + 5;
      Twin<uint8_t> fc1(make_rows(rng, capacity * in_cols, SFMOE_DTYPE_BF16));
      Twin<uint8_t> g_rows(make_rows(rng, capacity * F, SFMOE_DTYPE_BF16));
      std::vector<float> w(capacity);
      for (float& v : w) v = static_cast<float>(rng() % 1000) / 997.0f;
      Twin<float> weights(w), d_weights(static_cast<size_t>(capacity), -9.0f);
      Twin<int64_t> t_offsets(offsets), rows(real);
      // |g| . |act| per row, for the sum's tolerance (the inputs before they are overwritten).
      std::vector<double> magnitude(capacity, 0.0);
      ActivationConfig config{};
      config.kind = kind;
      for (int64_t r = 0; r < capacity; ++r) {
        for (int64_t j = 0; j < F; ++j) {
          uint16_t gate, up = 0, d;
          std::memcpy(&gate, &fc1.host[(r * in_cols + j) * 2], 2);
          if (gated) std::memcpy(&up, &fc1.host[(r * in_cols + F + j) * 2], 2);
          std::memcpy(&d, &g_rows.host[(r * F + j) * 2], 2);
          const float y = cpu::Activation<float>::forward(config, numerics::bf16_to_f32(gate),
                                                          numerics::bf16_to_f32(up));
          magnitude[r] += std::fabs(double(y) * numerics::bf16_to_f32(d));
        }
      }
      for (sfmoe_memory m : kBoth) {
        ActivationBackwardArgs b{};
        b.config = config;
        b.groups = GroupRowsView{t_offsets.on(m), rows.on(m), G};
        b.cols = F;
        b.input = fc1.on(m);
        b.input_dtype = SFMOE_DTYPE_BF16;
        b.d_output = g_rows.on(m);
        b.d_output_dtype = SFMOE_DTYPE_BF16;
        b.d_input = fc1.on(m);
        b.d_input_dtype = SFMOE_DTYPE_BF16;
        b.row_capacity = capacity;
        b.row_weights = weights.on(m);
        b.d_row_weights = d_weights.on(m);
        b.weighted_output = g_rows.on(m);
        ASSERT_EQ(ops::backend_for(m).activation_backward(b, nullptr), SFMOE_SUCCESS);
      }
      CUDA_OK(cudaDeviceSynchronize());
      const std::string what =
          "kind " + std::to_string(static_cast<int>(kind)) + " F=" + std::to_string(F);
      EXPECT_TRUE(fc1.same((what + " d input in place").c_str()));
      EXPECT_TRUE(g_rows.same((what + " weighted activations in place").c_str()));
      const std::vector<float> got = d_weights.device.download();
      for (int64_t r = 0; r < capacity; ++r) {
        const float want = d_weights.host[r];
        if (!std::isfinite(want) || !std::isfinite(magnitude[r])) {  // NaN / Inf inputs
          EXPECT_EQ(std::isnan(got[r]), std::isnan(want)) << what << " row " << r;
          continue;
        }
        ASSERT_NEAR(got[r], want, 1e-5 * magnitude[r] + 1e-30) << what << " row " << r;
      }
      ++checked;
    }
  }
  std::printf("[ activation ] %d weighted in-place backward cases vs CPU\n", checked);
}

TEST(CudaPermute, GatherFormAndSlotValuesEqualTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 18);
  const int64_t tokens = 3001, E = 64, k = 6, alignment = 16;
  for (int64_t H : {264, 41}) {
    // A row map from the CPU permute (routing of distinct experts per token: two of experts 0-7,
    // which a capacity then cuts, and the others from 8-63), shared by both backends.
    std::vector<int32_t> ids(tokens * k);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> crowded(8), others(E - 8);
      for (int32_t e = 0; e < E; ++e) (e < 8 ? crowded[e] : others[e - 8]) = e;
      std::shuffle(crowded.begin(), crowded.end(), rng);
      std::shuffle(others.begin(), others.end(), rng);
      for (int64_t i = 0; i < k; ++i) ids[t * k + i] = i < 2 ? crowded[i] : others[i - 2];
    }
    const int64_t R = tokens * k + E * (alignment - 1);
    std::vector<uint8_t> x = make_rows(rng, tokens * H, SFMOE_DTYPE_BF16);
    std::vector<uint8_t> rows(R * H * 2, 0xA5);
    std::vector<int64_t> offsets(E + 1), row_map(tokens * k), kept(E), dropped(E);
    PermuteArgs p{};
    p.tokens = x.data();
    p.dtype = SFMOE_DTYPE_BF16;
    p.num_tokens = tokens;
    p.hidden = H;
    p.top_k = k;
    p.num_experts = E;
    p.topk_ids = ids.data();
    p.alignment = alignment;
    p.expert_capacity = 700;
    p.row_capacity = R;
    p.permuted = rows.data();
    p.expert_offsets = offsets.data();
    p.row_map = row_map.data();
    p.tokens_per_expert = kept.data();
    p.dropped_per_expert = dropped.data();
    ASSERT_EQ(ops::backend_for(SFMOE_MEMORY_HOST).permute(p, nullptr), SFMOE_SUCCESS);
    Twin<uint8_t> tokens_in(x), gathered(static_cast<size_t>(R * H * 2), 0x5A);
    Twin<int64_t> t_map(row_map), t_offsets(offsets), t_kept(kept);
    std::vector<float> slots(tokens * k);
    for (float& v : slots) v = static_cast<float>(rng() % 4096) / 64.0f - 32.0f;
    Twin<float> t_slots(slots), row_values(static_cast<size_t>(R), -3.0f),
        back(static_cast<size_t>(tokens * k), NAN);
    Twin<int32_t> sources(static_cast<size_t>(R), 777);
    // permute writing the routing only (the layer's gathered FC1 rows): the same routing.
    Twin<int64_t> only_offsets(std::vector<int64_t>(E + 1, -5)),
        only_map(std::vector<int64_t>(tokens * k, -5)), only_kept(std::vector<int64_t>(E, -5)),
        only_dropped(std::vector<int64_t>(E, -5));
    Twin<int32_t> t_ids(ids);
    std::vector<uint8_t> permute_workspace(
        static_cast<size_t>(permute_workspace_elements(tokens, E) * 4), 0);
    Twin<uint8_t> t_permute_workspace(permute_workspace);
    for (sfmoe_memory m : kBoth) {
      PermuteArgs routing = p;
      routing.tokens = tokens_in.on(m);
      routing.topk_ids = t_ids.on(m);
      routing.permuted = nullptr;
      routing.expert_offsets = only_offsets.on(m);
      routing.row_map = only_map.on(m);
      routing.tokens_per_expert = only_kept.on(m);
      routing.dropped_per_expert = only_dropped.on(m);
      routing.workspace = reinterpret_cast<int32_t*>(t_permute_workspace.on(m));
      ASSERT_EQ(ops::backend_for(m).permute(routing, nullptr), SFMOE_SUCCESS);
      ASSERT_EQ(ops::backend_for(m).row_sources(
                    RowSourcesArgs{t_map.on(m), tokens, k, R, sources.on(m)}, nullptr),
                SFMOE_SUCCESS);
    }
    for (sfmoe_memory m : kBoth) {
      UnpermuteBackwardArgs g{};
      g.d_out = tokens_in.on(m);
      g.d_out_dtype = SFMOE_DTYPE_BF16;
      g.rows_dtype = SFMOE_DTYPE_BF16;
      g.num_tokens = tokens;
      g.hidden = H;
      g.top_k = k;
      g.row_capacity = R;
      g.row_map = t_map.on(m);
      g.d_rows = gathered.on(m);
      g.d_rows_dtype = SFMOE_DTYPE_BF16;
      g.offsets = t_offsets.on(m);
      g.group_rows = t_kept.on(m);
      g.num_groups = E;
      ASSERT_EQ(ops::backend_for(m).unpermute_backward(g, nullptr), SFMOE_SUCCESS);
      ASSERT_EQ(ops::backend_for(m).slot_values(SlotValuesArgs{t_map.on(m), tokens * k, R, true,
                                                               t_slots.on(m), row_values.on(m)},
                                                nullptr),
                SFMOE_SUCCESS);
      ASSERT_EQ(ops::backend_for(m).slot_values(
                    SlotValuesArgs{t_map.on(m), tokens * k, R, false, row_values.on(m), back.on(m)},
                    nullptr),
                SFMOE_SUCCESS);
    }
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(gathered.same("gathered rows"));
    EXPECT_TRUE(row_values.same("slot values to rows"));
    EXPECT_TRUE(back.same("row values to slots"));
    EXPECT_TRUE(sources.same("row sources"));
    for (auto* routing : {&only_offsets, &only_map, &only_kept, &only_dropped}) {
      EXPECT_TRUE(routing->same("routing-only permute"));
    }
    EXPECT_EQ(only_map.host, row_map);
    EXPECT_EQ(only_offsets.host, offsets);
    // The gather is permute, bit for bit, over the groups' rows.
    EXPECT_EQ(0, std::memcmp(gathered.host.data(), rows.data(), offsets[E] * H * 2)) << H;
  }
}

// The activation quantized on the fly (MXFP8 and NVFP4 with both scale layouts, FP8 1x128, FP8
// per-tensor with given scales) and the group amax output, against the CPU backend's definition
// (the FP32 activations, then the grouped quantization), byte for byte over poisoned buffers.
TEST(CudaActivation, FusedQuantizationAndAmaxEqualTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 16);
  struct Fused {
    sfmoe_activation kind;
    sfmoe_scaling scaling;  // NONE: unquantized output, amax only
    sfmoe_dtype dtype;
    sfmoe_scale_layout layout;
    bool pow2;
    int64_t cols;
    int64_t in_alignment = 32;  // 1: group blocks of any size (the output keeps the offsets)
  };
  const Fused cases[] = {
      {SFMOE_ACTIVATION_SWIGLU, SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E4M3,
       SFMOE_SCALE_LAYOUT_COMPACT, false, 64, 1},
      {SFMOE_ACTIVATION_SWIGLU, SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E4M3,
       SFMOE_SCALE_LAYOUT_SWIZZLED, false, 96},
      {SFMOE_ACTIVATION_SWIGLU, SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E5M2,
       SFMOE_SCALE_LAYOUT_COMPACT, false, 256},
      {SFMOE_ACTIVATION_GELU, SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3,
       SFMOE_SCALE_LAYOUT_COMPACT, true, 256},
      {SFMOE_ACTIVATION_CLAMPED_SWIGLU, SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3,
       SFMOE_SCALE_LAYOUT_COMPACT, false, 384},
      {SFMOE_ACTIVATION_SWIGLU, SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3,
       SFMOE_SCALE_LAYOUT_COMPACT, false, 72, 1},  // per-tensor FP8, given scales
      {SFMOE_ACTIVATION_GELU, SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E5M2,
       SFMOE_SCALE_LAYOUT_COMPACT, false, 256},
      {SFMOE_ACTIVATION_SWIGLU, SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1,
       SFMOE_SCALE_LAYOUT_COMPACT, false, 64, 1},  // NVFP4: group amax pass, then the codes
      {SFMOE_ACTIVATION_SWIGLU, SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1,
       SFMOE_SCALE_LAYOUT_SWIZZLED, false, 48},  // 3 scale columns: the swizzle's padding
      {SFMOE_ACTIVATION_GELU, SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1,
       SFMOE_SCALE_LAYOUT_COMPACT, false, 256},
      {SFMOE_ACTIVATION_SQUARED_RELU, SFMOE_SCALING_NONE, SFMOE_DTYPE_BF16,
       SFMOE_SCALE_LAYOUT_COMPACT, false, 40},
      {SFMOE_ACTIVATION_SWIGLU, SFMOE_SCALING_NONE, SFMOE_DTYPE_BF16, SFMOE_SCALE_LAYOUT_COMPACT,
       false, 37},
  };
  int checked = 0;
  for (const Fused& fc : cases) {
    const bool gated = fc.kind == SFMOE_ACTIVATION_SWIGLU || fc.kind == SFMOE_ACTIVATION_GEGLU ||
                       fc.kind == SFMOE_ACTIVATION_CLAMPED_SWIGLU;
    const int64_t G = 40, a = fc.in_alignment, F = fc.cols, in_cols = gated ? 2 * F : F;
    std::vector<int64_t> offsets(G + 1, 0), real(G);
    for (int64_t g = 0; g < G; ++g) {
      real[g] = g < 3 ? g * 17 : static_cast<int64_t>(rng() % 120);
      offsets[g + 1] = offsets[g] + (real[g] + a - 1) / a * a + (a == 1 ? rng() % 3 : 0);
    }
    const int64_t R = offsets[G] + 32 + offsets[G] % 2;  // even: FP4 rows pack two per byte
    Twin<uint8_t> input(make_rows(rng, R * in_cols, SFMOE_DTYPE_BF16));
    const bool quantized = fc.scaling != SFMOE_SCALING_NONE;
    int64_t scale_bytes = 1;
    if (quantized) {
      int32_t ndim = 0;
      int64_t shape[2] = {1, 1};
      ASSERT_EQ(sfmoe_scale_shape(fc.scaling, fc.layout, G, R, F, &ndim, shape), SFMOE_SUCCESS);
      const bool byte_scales =
          fc.scaling == SFMOE_SCALING_MX_1X32 || fc.scaling == SFMOE_SCALING_NV_1X16;
      scale_bytes = shape[0] * (ndim == 2 ? shape[1] : 1) * (byte_scales ? 1 : 4);
    }
    const int64_t out_bytes = !quantized                         ? R * F * 2
                              : fc.dtype == SFMOE_DTYPE_FP4_E2M1 ? R * F / 2
                                                                 : R * F;
    Twin<uint8_t> output(static_cast<size_t>(out_bytes), 0xA5),
        scales(static_cast<size_t>(scale_bytes), 0x5A);
    Twin<float> amax(G, -3.0f), given(given_tensor_scales(rng, G));
    Twin<int64_t> t_offsets(offsets), out_offsets(G + 1, -4), rows(real);
    sfmoe_quantize_config qc = sfmoe_quantize_config_init();
    qc.power_of_two_scales = fc.pow2;
    const bool tensor = fc.scaling == SFMOE_SCALING_TENSOR;
    sfmoe_activation_config c = sfmoe_activation_config_init();
    c.kind = fc.kind;
    c.quantize = &qc;
    for (sfmoe_memory m : kBoth) {
      const sfmoe_grouped_tensor in =
          rows_in(m, input.on(m), SFMOE_DTYPE_BF16, G, R, in_cols, a, t_offsets.on(m));
      sfmoe_grouped_tensor out = rows_in(m, output.on(m), fc.dtype, G, R, F, 32, out_offsets.on(m));
      out.scaling = fc.scaling;
      out.scale_layout = fc.layout;
      if (quantized) out.rowwise_scale_inv = scales.on(m);
      out.amax = amax.on(m);
      if (tensor) qc.tensor_scales = given.on(m);
      const sfmoe_tensor t_rows = tensor_in(m, rows.on(m), SFMOE_DTYPE_INT64, {G});
      ASSERT_EQ(sfmoe_grouped_activation(&in, &t_rows, &c, &out, nullptr, nullptr), SFMOE_SUCCESS)
          << sfmoe_last_error();
    }
    CUDA_OK(cudaDeviceSynchronize());
    const std::string what = std::string("kind ") + std::to_string(fc.kind) + " " +
                             sfmoe_scaling_name(fc.scaling) + " F=" + std::to_string(F);
    EXPECT_TRUE(output.same((what + " codes / values").c_str()));
    EXPECT_TRUE(scales.same((what + " scales").c_str()));
    EXPECT_TRUE(amax.same((what + " amax").c_str()));
    EXPECT_TRUE(out_offsets.same((what + " offsets").c_str()));
    ++checked;
  }
  std::printf("[ activation ] %d fused-quantization / amax cases: bit-exact vs CPU\n", checked);
}

// ---- the chain, captured
// --------------------------------------------------------------------------

// router -> permute -> SwiGLU -> unpermute in one graph (global capture mode: a host sync or an
// allocation inside would fail the capture), replayed on new logits; every replay's ids, rows,
// activations and combined output equal the CPU backend's run of the same chain.
TEST(CudaMoeChain, CapturedRouterPermuteActivationUnpermuteReplaysOnNewLogits) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 14);
  const int64_t T = 1000, E = 64, k = 6, F = 48, H = 2 * F, a = 16;
  const int64_t capacity = T * k + E * (a - 1);
  sfmoe_router_config rc = sfmoe_router_config_init();
  rc.top_k = k;
  rc.score = SFMOE_ROUTER_SCORE_SIGMOID;
  rc.num_groups = 8;
  rc.group_topk = 3;
  rc.normalize = 1;
  rc.aux_loss_coeff = 1e-2f;
  sfmoe_permute_config pc = sfmoe_permute_config_init();
  sfmoe_activation_config ac = sfmoe_activation_config_init();
  Twin<float> logits(T * E, 0.0f), aux(1, 0.0f),
      workspace((sfmoe_router_workspace_bytes(T, E) / 4), 0.0f);
  Twin<int32_t> permute_workspace(static_cast<size_t>((sfmoe_permute_workspace_bytes(T, E) / 4)),
                                  0);
  Twin<int32_t> ids(T * k, 0);
  Twin<float> probs(T * k, 0.0f);
  Twin<int64_t> counts(E, 0), offsets(E + 1, 0), act_offsets(E + 1, 0), row_map(T * k, 0),
      dropped(E, 0);
  Twin<uint8_t> x(make_rows(rng, T * H, SFMOE_DTYPE_BF16));
  Twin<uint16_t> rows(capacity * H, 0x7FC1), act(capacity * F, 0x7FC1), out(T * F, 0x7FC1);
  Twin<float> rows_amax(E, -5.0f);  // permute's per-expert amax, refolded on every replay

  auto chain = [&](sfmoe_memory m, cudaStream_t stream) -> sfmoe_status {
    const sfmoe_tensor l = tensor_in(m, logits.on(m), SFMOE_DTYPE_FP32, {T, E});
    const sfmoe_tensor t_ids = tensor_in(m, ids.on(m), SFMOE_DTYPE_INT32, {T, k});
    const sfmoe_tensor t_p = tensor_in(m, probs.on(m), SFMOE_DTYPE_FP32, {T, k});
    const sfmoe_tensor t_c = tensor_in(m, counts.on(m), SFMOE_DTYPE_INT64, {E});
    const sfmoe_tensor t_aux = tensor_in(m, aux.on(m), SFMOE_DTYPE_FP32, {1});
    const sfmoe_tensor t_ws = tensor_in(m, workspace.on(m), SFMOE_DTYPE_FP32,
                                        {static_cast<int64_t>(workspace.host.size())});
    const sfmoe_tensor t_x = tensor_in(m, x.on(m), SFMOE_DTYPE_BF16, {T, H});
    sfmoe_grouped_tensor g_rows =
        rows_in(m, rows.on(m), SFMOE_DTYPE_BF16, E, capacity, H, a, offsets.on(m));
    g_rows.amax = rows_amax.on(m);
    const sfmoe_grouped_tensor g_act =
        rows_in(m, act.on(m), SFMOE_DTYPE_BF16, E, capacity, F, a, act_offsets.on(m));
    const sfmoe_tensor t_map = tensor_in(m, row_map.on(m), SFMOE_DTYPE_INT64, {T, k});
    const sfmoe_tensor t_drop = tensor_in(m, dropped.on(m), SFMOE_DTYPE_INT64, {E});
    const sfmoe_tensor t_out = tensor_in(m, out.on(m), SFMOE_DTYPE_BF16, {T, F});
    const sfmoe_tensor t_pws = tensor_in(m, permute_workspace.on(m), SFMOE_DTYPE_INT32,
                                         {static_cast<int64_t>(permute_workspace.host.size())});
    sfmoe_status s =
        sfmoe_router_forward(&l, nullptr, &rc, &t_ids, &t_p, &t_c, &t_aux, nullptr, &t_ws, stream);
    if (s == SFMOE_SUCCESS)
      s = sfmoe_permute(&t_x, &t_ids, &pc, &g_rows, &t_map, &t_c, &t_drop, &t_pws, nullptr, stream);
    if (s == SFMOE_SUCCESS)
      s = sfmoe_grouped_activation(&g_rows, &t_c, &ac, &g_act, nullptr, stream);
    if (s == SFMOE_SUCCESS) s = sfmoe_unpermute(&g_act, &t_map, &t_p, &t_out, nullptr, stream);
    return s;
  };

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const sfmoe_status captured = chain(SFMOE_MEMORY_CUDA, stream);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ASSERT_EQ(captured, SFMOE_SUCCESS) << sfmoe_last_error();
  ASSERT_EQ(end, cudaSuccess);
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 4; ++replay) {
    logits.host = make_logits(rng, T, E, replay % 2 == 1);
    CUDA_OK(logits.device.upload(logits.host));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_EQ(chain(SFMOE_MEMORY_HOST, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
    EXPECT_TRUE(ids.same("topk_ids")) << "replay " << replay;
    EXPECT_TRUE(probs.same("probs")) << "replay " << replay;
    EXPECT_TRUE(counts.same("tokens_per_expert")) << "replay " << replay;
    EXPECT_TRUE(offsets.same("permuted offsets")) << "replay " << replay;
    EXPECT_TRUE(row_map.same("row_map")) << "replay " << replay;
    EXPECT_TRUE(rows.same("permuted rows (whole buffer)")) << "replay " << replay;
    EXPECT_TRUE(rows_amax.same("permuted rows' amax")) << "replay " << replay;
    EXPECT_TRUE(act.same("activations (whole buffer)")) << "replay " << replay;
    EXPECT_TRUE(out.same("combined output")) << "replay " << replay;
    EXPECT_TRUE(close(aux.device.download(), aux.host, T * std::ldexp(1.0, -24), 0.0, "aux_loss"))
        << "replay " << replay;
    // Rows of earlier replays may linger past this replay's groups in both buffers alike.
  }
  std::printf(
      "[ graph ] router -> permute -> SwiGLU -> unpermute captured, 4 replays on new logits, "
      "checked bit for bit\n");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

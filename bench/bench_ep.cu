// Expert parallelism's loopback on one GPU (docs/ep.md): the receive buffers' bytes for a
// DeepSeek-V3-like EP8 layer (T 4096 tokens per rank, k 8, H 7168, 32 experts per rank), BF16 and
// FP8 1x128 payloads, at capacity factors 1.0 - 2.0 against the worst case, and with SPILL's second
// round; and the loopback's dispatch, combine and combine backward timed with all 8 ranks on this
// GPU, balanced and Zipf-like routings, SPILL at factor 1.0 beside an unlimited capacity, the
// moves' bytes as a fraction of cudaMemcpyAsync's device-to-device rate in the same process.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "sfmoe/ep.h"

namespace {

using namespace sfmoe::bench;

constexpr int32_t kWorld = 8;
constexpr int64_t kTokens = 4096, kTopK = 8, kHidden = 7168, kExpertsPerRank = 32;

#define EP_OK(call)                                                       \
  do {                                                                    \
    const sfmoe_status s_ = (call);                                       \
    if (s_ != SFMOE_SUCCESS) {                                            \
      std::fprintf(stderr, "%s failed: %s\n", #call, sfmoe_last_error()); \
      std::exit(2);                                                       \
    }                                                                     \
  } while (0)

// A group's configuration: BF16 or FP8 1x128 rows, a capacity, DROP or SPILL (spill rows).
sfmoe_ep_config config_of(int64_t capacity, bool fp8 = false, int64_t spill = 0) {
  sfmoe_ep_config c = sfmoe_ep_config_init();
  c.world_size = kWorld;
  c.experts_per_rank = kExpertsPerRank;
  c.max_tokens_per_rank = kTokens;
  c.top_k = kTopK;
  c.hidden = kHidden;
  c.payload = fp8 ? SFMOE_DTYPE_FP8_E4M3 : SFMOE_DTYPE_BF16;
  c.payload_scaling = fp8 ? SFMOE_SCALING_BLOCK_1X128 : SFMOE_SCALING_NONE;
  c.row_alignment = 128;
  c.receive_capacity = capacity;
  c.overflow = spill != 0 ? SFMOE_EP_OVERFLOW_SPILL : SFMOE_EP_OVERFLOW_DROP;
  c.spill_capacity = spill;
  return c;
}

sfmoe_ep_plan plan_of(const sfmoe_ep_config& c) {
  sfmoe_ep_group* g = nullptr;
  EP_OK(sfmoe_ep_group_create(&c, SFMOE_MEMORY_HOST, 0, &g));
  sfmoe_ep_plan plan = sfmoe_ep_plan_init();
  EP_OK(sfmoe_ep_group_get_plan(g, &plan));
  sfmoe_ep_group_destroy(g);
  return plan;
}

// A rank's received buffer in MiB: the rows and the scales beside them.
double receive_mib(const sfmoe_ep_plan& p, const sfmoe_ep_config& c) {
  const double row = kHidden * sfmoe_dtype_bits(c.payload) / 8.0 +
                     p.scale_columns * sfmoe_dtype_bits(p.scale_dtype) / 8.0;
  return p.receive_rows * row / (1 << 20);
}

sfmoe_tensor device_tensor(void* data, sfmoe_dtype dtype, std::initializer_list<int64_t> shape) {
  const std::vector<int64_t> dims(shape);
  return sfmoe_tensor_make(data, dtype, static_cast<int32_t>(dims.size()), dims.data(),
                           SFMOE_MEMORY_CUDA, 0);
}

std::vector<int32_t> routing(std::mt19937_64& rng, bool zipf) {
  const int64_t E = kWorld * kExpertsPerRank;
  std::vector<int32_t> ids(kTokens * kTopK);
  std::vector<double> base(E);
  for (int64_t e = 0; e < E; ++e) base[e] = zipf ? 1.0 / std::pow(e + 1.0, 0.8) : 1.0;
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<double> w = base;
    for (int64_t i = 0; i < kTopK; ++i) {
      std::discrete_distribution<int32_t> pick(w.begin(), w.end());
      const int32_t e = pick(rng);
      ids[t * kTopK + i] = e;
      w[e] = 0.0;
    }
  }
  return ids;
}

}  // namespace

int main() {
  JsonLog json;
  // ---- receive-buffer bytes ----
  std::printf(
      "EP8 (T %lld per rank, k %lld, H %lld, %lld experts per rank): a rank's receive buffer\n",
      static_cast<long long>(kTokens), static_cast<long long>(kTopK),
      static_cast<long long>(kHidden), static_cast<long long>(kExpertsPerRank));
  std::printf("%-22s %12s %10s %16s %30s\n", "capacity", "rows", "BF16 MiB", "FP8 1x128 MiB",
              "+ SPILL of 0.5 T k: rows, MiB");
  const double factors[] = {1.0, 1.25, 1.5, 2.0, 0.0};
  for (double f : factors) {
    const int64_t capacity =
        f > 0 ? static_cast<int64_t>(std::ceil(f * kTokens * kTopK)) : SFMOE_EP_CAPACITY_WORST_CASE;
    const sfmoe_ep_config bf16 = config_of(capacity), fp8 = config_of(capacity, true);
    const sfmoe_ep_plan pb = plan_of(bf16), pf = plan_of(fp8);
    char label[64];
    std::snprintf(label, sizeof(label), f > 0 ? "factor %.2f" : "worst case", f);
    char spill[64] = "-";
    if (f > 0) {
      const sfmoe_ep_config sc = config_of(capacity, true, kTokens * kTopK / 2);
      const sfmoe_ep_plan ps = plan_of(sc);
      std::snprintf(spill, sizeof(spill), "%lld, %.0f", static_cast<long long>(ps.receive_rows),
                    receive_mib(ps, sc));
    }
    std::printf("%-22s %12lld %10.0f %16.0f %30s\n", label, static_cast<long long>(pb.receive_rows),
                receive_mib(pb, bf16), receive_mib(pf, fp8), spill);
  }

  // ---- device loopback timing ----
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU: the loopback timing is skipped\n");
    return 0;
  }
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The copy rate in this process.
  const size_t copy_bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  BENCH_CUDA(cudaMalloc(&a, copy_bytes));
  BENCH_CUDA(cudaMalloc(&b, copy_bytes));
  BENCH_CUDA(cudaMemset(a, 1, copy_bytes));
  const Timing copy = time_runs(
      [&](int) { BENCH_CUDA(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, stream)); },
      stream);
  const double copy_tbps = 2.0 * copy_bytes / (copy.median_ms * 1e-3) / 1e12;
  cudaFree(a);
  cudaFree(b);
  std::printf("\ncudaMemcpyAsync device to device: %.2f TB/s (read + written)\n", copy_tbps);

  std::mt19937_64 rng(1234);
  struct Case {
    const char* label;
    bool zipf;
    double factor;  // 0: the worst case
    bool fp8;
    bool spill;  // SPILL with the worst case's spill capacity: no row lost
  };
  const Case cases[] = {
      {"balanced, factor 2.00", false, 2.0, false, false},
      {"balanced, factor 1.25", false, 1.25, false, false},
      {"zipf, factor 2.00", true, 2.0, false, false},
      {"zipf, factor 1.25", true, 1.25, false, false},
      {"zipf, unlimited", true, 0.0, false, false},
      {"zipf, factor 1.00 + spill", true, 1.0, false, true},
      {"balanced, factor 1.25, fp8 1x128", false, 1.25, true, false},
      {"zipf, factor 1.00 + spill, fp8", true, 1.0, true, true},
  };
  std::printf("%-34s %9s %9s %9s %9s %9s %9s %8s %10s %8s\n", "loopback R 8 (BF16 unless fp8)",
              "dispatch", "combine", "comb.bwd", "step", "disp TB/s", "comb TB/s", "of copy",
              "max routed", "dropped");
  for (const Case& k : cases) {
    const int64_t capacity = k.factor > 0
                                 ? static_cast<int64_t>(std::ceil(k.factor * kTokens * kTopK))
                                 : SFMOE_EP_CAPACITY_WORST_CASE;
    const sfmoe_ep_config c =
        config_of(capacity, k.fp8, k.spill ? SFMOE_EP_CAPACITY_WORST_CASE : 0);
    sfmoe_ep_group* g = nullptr;
    EP_OK(sfmoe_ep_group_create(&c, SFMOE_MEMORY_CUDA, 0, &g));
    sfmoe_ep_plan plan = sfmoe_ep_plan_init();
    EP_OK(sfmoe_ep_group_get_plan(g, &plan));
    const int64_t R = kWorld, El = kExpertsPerRank, E = R * El, G = plan.rounds * El;
    const int64_t elem = k.fp8 ? 1 : 2, S = plan.scale_columns;
    const sfmoe_dtype pay = c.payload;
    std::vector<void*> x(R), xs(R), ids(R), probs(R), received(R), rscales(R), y(R), offsets(R),
        handle(R), out(R), d_rows(R), d_probs(R), kept(R), routed(R), dropped(R);
    std::vector<sfmoe_tensor> tx, txs, tids, tprobs, trec, trs, ty, toff, thandle, tout, tdrows,
        tdprobs, tkept, trouted, tdropped;
    for (int64_t r = 0; r < R; ++r) {
      BENCH_CUDA(cudaMalloc(&x[r], kTokens * kHidden * elem));
      BENCH_CUDA(cudaMemset(x[r], 0x3C, kTokens * kHidden * elem));
      BENCH_CUDA(cudaMalloc(&xs[r], kTokens * (S > 0 ? S : 1) * 4));
      BENCH_CUDA(cudaMemset(xs[r], 0x3C, kTokens * (S > 0 ? S : 1) * 4));
      const std::vector<int32_t> host_ids = routing(rng, k.zipf);
      BENCH_CUDA(cudaMalloc(&ids[r], host_ids.size() * 4));
      BENCH_CUDA(cudaMemcpy(ids[r], host_ids.data(), host_ids.size() * 4, cudaMemcpyHostToDevice));
      BENCH_CUDA(cudaMalloc(&probs[r], kTokens * kTopK * 4));
      BENCH_CUDA(cudaMemset(probs[r], 0, kTokens * kTopK * 4));
      BENCH_CUDA(cudaMalloc(&received[r], plan.receive_rows * kHidden * elem));
      BENCH_CUDA(cudaMalloc(&rscales[r], plan.receive_rows * (S > 0 ? S : 1) * 4));
      BENCH_CUDA(cudaMalloc(&y[r], plan.receive_rows * kHidden * 2));
      BENCH_CUDA(cudaMemset(y[r], 0x3C, plan.receive_rows * kHidden * 2));
      BENCH_CUDA(cudaMalloc(&d_rows[r], plan.receive_rows * kHidden * 2));
      BENCH_CUDA(cudaMalloc(&offsets[r], plan.rounds * (El + 1) * 8));
      BENCH_CUDA(cudaMalloc(&kept[r], G * 8));
      BENCH_CUDA(cudaMalloc(&routed[r], El * 8));
      BENCH_CUDA(cudaMalloc(&dropped[r], E * 8));
      BENCH_CUDA(cudaMalloc(&handle[r], plan.handle_bytes));
      BENCH_CUDA(cudaMalloc(&out[r], kTokens * kHidden * 2));
      BENCH_CUDA(cudaMalloc(&d_probs[r], kTokens * kTopK * 4));
      tx.push_back(device_tensor(x[r], pay, {kTokens, kHidden}));
      txs.push_back(device_tensor(xs[r], plan.scale_dtype, {kTokens, S}));
      tids.push_back(device_tensor(ids[r], SFMOE_DTYPE_INT32, {kTokens, kTopK}));
      tprobs.push_back(device_tensor(probs[r], SFMOE_DTYPE_FP32, {kTokens, kTopK}));
      trec.push_back(device_tensor(received[r], pay, {plan.receive_rows, kHidden}));
      trs.push_back(device_tensor(rscales[r], plan.scale_dtype, {plan.receive_rows, S}));
      ty.push_back(device_tensor(y[r], SFMOE_DTYPE_BF16, {plan.receive_rows, kHidden}));
      tdrows.push_back(device_tensor(d_rows[r], SFMOE_DTYPE_BF16, {plan.receive_rows, kHidden}));
      toff.push_back(device_tensor(offsets[r], SFMOE_DTYPE_INT64, {plan.rounds * (El + 1)}));
      tkept.push_back(device_tensor(kept[r], SFMOE_DTYPE_INT64, {G}));
      trouted.push_back(device_tensor(routed[r], SFMOE_DTYPE_INT64, {El}));
      tdropped.push_back(device_tensor(dropped[r], SFMOE_DTYPE_INT64, {E}));
      thandle.push_back(device_tensor(handle[r], SFMOE_DTYPE_FP8_E4M3, {plan.handle_bytes}));
      tout.push_back(device_tensor(out[r], SFMOE_DTYPE_BF16, {kTokens, kHidden}));
      tdprobs.push_back(device_tensor(d_probs[r], SFMOE_DTYPE_FP32, {kTokens, kTopK}));
    }
    auto ptrs = [](std::vector<sfmoe_tensor>& v) {
      std::vector<const sfmoe_tensor*> p;
      for (sfmoe_tensor& t : v) p.push_back(&t);
      return p;
    };
    auto px = ptrs(tx), pxs = ptrs(txs), pids = ptrs(tids), pprobs = ptrs(tprobs),
         prec = ptrs(trec), prs = ptrs(trs), py = ptrs(ty), poff = ptrs(toff),
         phandle = ptrs(thandle), pout = ptrs(tout), pdrows = ptrs(tdrows), pdprobs = ptrs(tdprobs),
         pkept = ptrs(tkept), prouted = ptrs(trouted), pdropped = ptrs(tdropped);
    sfmoe_ep_dispatch_args d = sfmoe_ep_dispatch_args_init();
    d.tokens = px.data();
    d.topk_ids = pids.data();
    d.received = prec.data();
    d.group_offsets = poff.data();
    d.handle = phandle.data();
    d.tokens_per_expert = pkept.data();
    d.routed_per_expert = prouted.data();
    d.dropped_per_expert = pdropped.data();
    if (S > 0) {
      d.token_scales = pxs.data();
      d.received_scales = prs.data();
    }
    d.stream = stream;
    sfmoe_ep_combine_args cb = sfmoe_ep_combine_args_init();
    cb.rows = py.data();
    cb.probs = pprobs.data();
    cb.handle = phandle.data();
    cb.out = pout.data();
    cb.stream = stream;
    sfmoe_ep_combine_backward_args bb = sfmoe_ep_combine_backward_args_init();
    bb.d_out = pout.data();
    bb.rows = py.data();
    bb.probs = pprobs.data();
    bb.handle = phandle.data();
    bb.d_rows = pdrows.data();
    bb.d_probs = pdprobs.data();
    bb.stream = stream;
    const Timing td = time_runs([&](int) { EP_OK(sfmoe_ep_dispatch(g, &d)); }, stream, 2, 10);
    const Timing tc = time_runs([&](int) { EP_OK(sfmoe_ep_combine(g, &cb)); }, stream, 2, 10);
    const Timing tb =
        time_runs([&](int) { EP_OK(sfmoe_ep_combine_backward(g, &bb)); }, stream, 2, 10);
    // Bytes: each rank's kept rows (padding included: an upper bound) read or written once per
    // slot, its tokens read (dispatch) or written (combine).
    int64_t kept_rows = 0, max_routed = 0, lost = 0;
    for (int64_t r = 0; r < R; ++r) {
      std::vector<int64_t> off(plan.rounds * (El + 1)), rt(El), dr(E);
      BENCH_CUDA(cudaMemcpy(off.data(), offsets[r], off.size() * 8, cudaMemcpyDeviceToHost));
      BENCH_CUDA(cudaMemcpy(rt.data(), routed[r], rt.size() * 8, cudaMemcpyDeviceToHost));
      BENCH_CUDA(cudaMemcpy(dr.data(), dropped[r], dr.size() * 8, cudaMemcpyDeviceToHost));
      for (int64_t round = 0; round < plan.rounds; ++round) kept_rows += off[round * (El + 1) + El];
      int64_t sum = 0;
      for (int64_t v : rt) sum += v;
      max_routed = sum > max_routed ? sum : max_routed;
      for (int64_t v : dr) lost += v;
    }
    const double row_bytes = kHidden * elem + S * sfmoe_dtype_bits(plan.scale_dtype) / 8.0;
    const double dispatch_tbps =
        (kept_rows * row_bytes + R * kTokens * row_bytes) / (td.median_ms * 1e-3) / 1e12;
    const double combine_tbps =
        (kept_rows + R * kTokens) * kHidden * 2.0 / (tc.median_ms * 1e-3) / 1e12;
    const double step = td.median_ms + tc.median_ms + tb.median_ms;
    std::printf("%-34s %6.3f ms %6.3f ms %6.3f ms %6.3f ms %9.2f %9.2f %7.0f%% %10lld %8lld\n",
                k.label, td.median_ms, tc.median_ms, tb.median_ms, step, dispatch_tbps,
                combine_tbps, 100.0 * combine_tbps / copy_tbps, static_cast<long long>(max_routed),
                static_cast<long long>(lost));
    char record[384];
    std::snprintf(record, sizeof(record),
                  "{\"bench\": \"ep_loopback\", \"case\": \"%s\", \"dispatch_ms\": %.4f, "
                  "\"combine_ms\": %.4f, \"combine_backward_ms\": %.4f, \"combine_tbps\": %.3f, "
                  "\"receive_rows\": %lld, \"max_routed\": %lld, \"dropped\": %lld}",
                  k.label, td.median_ms, tc.median_ms, tb.median_ms, combine_tbps,
                  static_cast<long long>(plan.receive_rows), static_cast<long long>(max_routed),
                  static_cast<long long>(lost));
    json.add(record);
    for (int64_t r = 0; r < R; ++r) {
      for (void* p : {x[r], xs[r], ids[r], probs[r], received[r], rscales[r], y[r], offsets[r],
                      handle[r], out[r], d_rows[r], d_probs[r], kept[r], routed[r], dropped[r]}) {
        cudaFree(p);
      }
    }
    sfmoe_ep_group_destroy(g);
  }
  cudaStreamDestroy(stream);
  return 0;
}

// Expert parallelism's loopback on one GPU (docs/ep.md): the receive buffers' bytes for a
// DeepSeek-V3-like EP8 layer (T 4096 tokens per rank, k 8, H 7168, 32 experts per rank) at capacity
// factors 1.0 - 2.0 against the worst case; and the loopback's dispatch, combine and combine
// backward timed with all 8 ranks on this GPU, balanced and Zipf-like routings, the moves' bytes as
// a fraction of cudaMemcpyAsync's device-to-device rate measured in the same process.
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

sfmoe_ep_config config_of(int64_t capacity, sfmoe_memory) {
  sfmoe_ep_config c = sfmoe_ep_config_init();
  c.world_size = kWorld;
  c.experts_per_rank = kExpertsPerRank;
  c.max_tokens_per_rank = kTokens;
  c.top_k = kTopK;
  c.hidden = kHidden;
  c.payload = SFMOE_DTYPE_BF16;
  c.row_alignment = 128;
  c.receive_capacity = capacity;
  return c;
}

sfmoe_tensor device_tensor(void* data, sfmoe_dtype dtype, std::initializer_list<int64_t> shape) {
  const std::vector<int64_t> dims(shape);
  return sfmoe_tensor_make(data, dtype, static_cast<int32_t>(dims.size()), dims.data(),
                           SFMOE_MEMORY_CUDA, 0);
}

#define EP_OK(call)                                                       \
  do {                                                                    \
    const sfmoe_status s_ = (call);                                       \
    if (s_ != SFMOE_SUCCESS) {                                            \
      std::fprintf(stderr, "%s failed: %s\n", #call, sfmoe_last_error()); \
      std::exit(2);                                                       \
    }                                                                     \
  } while (0)

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
  std::printf("%-22s %12s %14s %20s\n", "capacity", "rows", "BF16 MiB", "FP8 1x128 MiB (rows)");
  const double factors[] = {1.0, 1.25, 1.5, 2.0, 0.0};
  for (double f : factors) {
    const int64_t capacity =
        f > 0 ? static_cast<int64_t>(std::ceil(f * kTokens * kTopK)) : SFMOE_EP_CAPACITY_WORST_CASE;
    sfmoe_ep_config c = config_of(capacity, SFMOE_MEMORY_HOST);
    sfmoe_ep_group* g = nullptr;
    EP_OK(sfmoe_ep_group_create(&c, SFMOE_MEMORY_HOST, 0, &g));
    sfmoe_ep_plan plan = sfmoe_ep_plan_init();
    EP_OK(sfmoe_ep_group_get_plan(g, &plan));
    sfmoe_ep_group_destroy(g);
    const double bf16 = plan.receive_rows * kHidden * 2.0 / (1 << 20);
    // (the FP8 payload is not built yet: its size, codes plus one FP32 scale per 128 values)
    const double fp8 = plan.receive_rows * (kHidden + kHidden / 128 * 4.0) / (1 << 20);
    char label[64];
    std::snprintf(label, sizeof(label), f > 0 ? "factor %.2f" : "worst case", f);
    std::printf("%-22s %12lld %14.0f %20.0f\n", label, static_cast<long long>(plan.receive_rows),
                bf16, fp8);
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
  std::printf("%-34s %10s %10s %10s %12s %12s\n", "loopback R 8, BF16, capacity", "dispatch",
              "combine", "comb. bwd", "combine TB/s", "of copy");
  for (bool zipf : {false, true}) {
    for (double f : {2.0, 1.25}) {
      const int64_t capacity = static_cast<int64_t>(std::ceil(f * kTokens * kTopK));
      sfmoe_ep_config c = config_of(capacity, SFMOE_MEMORY_CUDA);
      sfmoe_ep_group* g = nullptr;
      EP_OK(sfmoe_ep_group_create(&c, SFMOE_MEMORY_CUDA, 0, &g));
      sfmoe_ep_plan plan = sfmoe_ep_plan_init();
      EP_OK(sfmoe_ep_group_get_plan(g, &plan));
      const int64_t R = kWorld, El = kExpertsPerRank;
      std::vector<void*> x(R), ids(R), probs(R), received(R), offsets(R), handle(R), out(R),
          d_rows(R), d_probs(R);
      std::vector<sfmoe_tensor> tx, tids, tprobs, trec, toff, thandle, tout, tdrows, tdprobs;
      for (int64_t r = 0; r < R; ++r) {
        BENCH_CUDA(cudaMalloc(&x[r], kTokens * kHidden * 2));
        BENCH_CUDA(cudaMemset(x[r], 0x3C, kTokens * kHidden * 2));
        const std::vector<int32_t> host_ids = routing(rng, zipf);
        BENCH_CUDA(cudaMalloc(&ids[r], host_ids.size() * 4));
        BENCH_CUDA(
            cudaMemcpy(ids[r], host_ids.data(), host_ids.size() * 4, cudaMemcpyHostToDevice));
        BENCH_CUDA(cudaMalloc(&probs[r], kTokens * kTopK * 4));
        BENCH_CUDA(cudaMemset(probs[r], 0, kTokens * kTopK * 4));
        BENCH_CUDA(cudaMalloc(&received[r], plan.receive_rows * kHidden * 2));
        BENCH_CUDA(cudaMalloc(&d_rows[r], plan.receive_rows * kHidden * 2));
        BENCH_CUDA(cudaMalloc(&offsets[r], (El + 1) * 8));
        BENCH_CUDA(cudaMalloc(&handle[r], plan.handle_bytes));
        BENCH_CUDA(cudaMalloc(&out[r], kTokens * kHidden * 2));
        BENCH_CUDA(cudaMalloc(&d_probs[r], kTokens * kTopK * 4));
        tx.push_back(device_tensor(x[r], SFMOE_DTYPE_BF16, {kTokens, kHidden}));
        tids.push_back(device_tensor(ids[r], SFMOE_DTYPE_INT32, {kTokens, kTopK}));
        tprobs.push_back(device_tensor(probs[r], SFMOE_DTYPE_FP32, {kTokens, kTopK}));
        trec.push_back(device_tensor(received[r], SFMOE_DTYPE_BF16, {plan.receive_rows, kHidden}));
        tdrows.push_back(device_tensor(d_rows[r], SFMOE_DTYPE_BF16, {plan.receive_rows, kHidden}));
        toff.push_back(device_tensor(offsets[r], SFMOE_DTYPE_INT64, {El + 1}));
        thandle.push_back(device_tensor(handle[r], SFMOE_DTYPE_FP8_E4M3, {plan.handle_bytes}));
        tout.push_back(device_tensor(out[r], SFMOE_DTYPE_BF16, {kTokens, kHidden}));
        tdprobs.push_back(device_tensor(d_probs[r], SFMOE_DTYPE_FP32, {kTokens, kTopK}));
      }
      auto ptrs = [](std::vector<sfmoe_tensor>& v) {
        std::vector<const sfmoe_tensor*> p;
        for (sfmoe_tensor& t : v) p.push_back(&t);
        return p;
      };
      auto px = ptrs(tx), pids = ptrs(tids), pprobs = ptrs(tprobs), prec = ptrs(trec),
           poff = ptrs(toff), phandle = ptrs(thandle), pout = ptrs(tout), pdrows = ptrs(tdrows),
           pdprobs = ptrs(tdprobs);
      sfmoe_ep_dispatch_args d = sfmoe_ep_dispatch_args_init();
      d.tokens = px.data();
      d.topk_ids = pids.data();
      d.received = prec.data();
      d.group_offsets = poff.data();
      d.handle = phandle.data();
      d.stream = stream;
      sfmoe_ep_combine_args cb = sfmoe_ep_combine_args_init();
      cb.rows = prec.data();
      cb.probs = pprobs.data();
      cb.handle = phandle.data();
      cb.out = pout.data();
      cb.stream = stream;
      sfmoe_ep_combine_backward_args bb = sfmoe_ep_combine_backward_args_init();
      bb.d_out = pout.data();
      bb.rows = prec.data();
      bb.probs = pprobs.data();
      bb.handle = phandle.data();
      bb.d_rows = pdrows.data();
      bb.d_probs = pdprobs.data();
      bb.stream = stream;
      const Timing td = time_runs([&](int) { EP_OK(sfmoe_ep_dispatch(g, &d)); }, stream, 2, 10);
      const Timing tc = time_runs([&](int) { EP_OK(sfmoe_ep_combine(g, &cb)); }, stream, 2, 10);
      const Timing tb =
          time_runs([&](int) { EP_OK(sfmoe_ep_combine_backward(g, &bb)); }, stream, 2, 10);
      // Combine's bytes: each rank's kept rows read once per slot, its tokens written.
      int64_t kept_rows = 0;
      for (int64_t r = 0; r < R; ++r) {
        std::vector<int64_t> off(El + 1);
        BENCH_CUDA(cudaMemcpy(off.data(), offsets[r], off.size() * 8, cudaMemcpyDeviceToHost));
        kept_rows += off[El];  // (padding included: an upper bound on the rows read)
      }
      const double bytes = (kept_rows + R * kTokens) * kHidden * 2.0;
      const double tbps = bytes / (tc.median_ms * 1e-3) / 1e12;
      char label[64];
      std::snprintf(label, sizeof(label), "%s, factor %.2f", zipf ? "zipf" : "balanced", f);
      std::printf("%-34s %8.3f ms %7.3f ms %7.3f ms %12.2f %11.0f%%\n", label, td.median_ms,
                  tc.median_ms, tb.median_ms, tbps, 100.0 * tbps / copy_tbps);
      char record[256];
      std::snprintf(record, sizeof(record),
                    "{\"bench\": \"ep_loopback\", \"case\": \"%s\", \"dispatch_ms\": %.4f, "
                    "\"combine_ms\": %.4f, \"combine_backward_ms\": %.4f, \"combine_tbps\": %.3f}",
                    label, td.median_ms, tc.median_ms, tb.median_ms, tbps);
      json.add(record);
      for (int64_t r = 0; r < R; ++r) {
        for (void* p : {x[r], ids[r], probs[r], received[r], offsets[r], handle[r], out[r],
                        d_rows[r], d_probs[r]}) {
          cudaFree(p);
        }
      }
      sfmoe_ep_group_destroy(g);
    }
  }
  cudaStreamDestroy(stream);
  return 0;
}

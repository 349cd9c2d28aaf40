// Memory-bound ceilings and ops, measured in one process:
//   copy   - our 16-byte vectorized copy kernel next to cudaMemcpyAsync (the peer), in TB/s of
//            bytes read + written, against the 4.17 TB/s reference of ../shared/GPU.md;
//   cast   - sfmoe_cast (BF16 -> FP8 E4M3 with a scale, FP8 -> BF16) on a [65536 x 7168] tensor,
//            as a fraction of the copy ceiling measured here, in this run.
#include <cstdio>
#include <string>

#include "bench/harness.h"
#include "sfmoe/cast.h"

namespace {

using namespace sfmoe::bench;

__global__ void copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride)
    out[i] = in[i];
}

__global__ void fill_kernel(uint32_t* p, int64_t n, uint32_t seed) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    // Two BF16 values of moderate magnitude (never zeros: timing on zeros flatters).
    const uint32_t lo = 0x3C00u + (h & 0x0FFFu), hi = 0x3C00u + ((h >> 12) & 0x0FFFu);
    p[i] = lo | (hi << 16) | ((h & 1u) << 31);
  }
}

struct Row {
  std::string what;
  double ms, tbps;
};

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  sms = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, sms, prop.l2CacheSize >> 20);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  JsonLog json;
  std::vector<Row> rows;

  // ---- copy ceiling: 2 GiB source (far beyond L2, so no rotation needed) ----
  const size_t copy_bytes = size_t(2) << 30;
  uint4 *src = nullptr, *dst = nullptr;
  BENCH_CUDA(cudaMalloc(&src, copy_bytes));
  BENCH_CUDA(cudaMalloc(&dst, copy_bytes));
  fill_kernel<<<sms * 8, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(src), copy_bytes / 4, 1);
  const int64_t vectors = copy_bytes / sizeof(uint4);
  const Timing memcpy_t = time_runs(
      [&](int) {
        BENCH_CUDA(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, stream));
      },
      stream);
  const Timing kernel_t =
      time_runs([&](int) { copy_kernel<<<sms * 8, 512, 0, stream>>>(src, dst, vectors); }, stream);
  const double memcpy_tbps = 2.0 * copy_bytes / (memcpy_t.median_ms * 1e-3) / 1e12;
  const double kernel_tbps = 2.0 * copy_bytes / (kernel_t.median_ms * 1e-3) / 1e12;
  const double ceiling = std::max(memcpy_tbps, kernel_tbps);
  rows.push_back({"copy 2 GiB, cudaMemcpyAsync (peer)", memcpy_t.median_ms, memcpy_tbps});
  rows.push_back({"copy 2 GiB, sfmoe 16-byte kernel", kernel_t.median_ms, kernel_tbps});
  BENCH_CUDA(cudaFree(src));
  BENCH_CUDA(cudaFree(dst));

  // ---- cast: [65536 x 7168] BF16 <-> FP8 E4M3 through the C API ----
  const int64_t elements = int64_t(65536) * 7168;
  void *bf16 = nullptr, *fp8 = nullptr;
  float* scale = nullptr;
  BENCH_CUDA(cudaMalloc(&bf16, elements * 2));
  BENCH_CUDA(cudaMalloc(&fp8, elements));
  BENCH_CUDA(cudaMalloc(&scale, sizeof(float)));
  const float scale_value = 64.0f;
  BENCH_CUDA(cudaMemcpy(scale, &scale_value, sizeof(float), cudaMemcpyHostToDevice));
  fill_kernel<<<sms * 8, 256, 0, stream>>>(static_cast<uint32_t*>(bf16), elements / 2, 7);
  sfmoe_tensor t_bf16 =
      sfmoe_tensor_make(bf16, SFMOE_DTYPE_BF16, 1, &elements, SFMOE_MEMORY_CUDA, 0);
  sfmoe_tensor t_fp8 =
      sfmoe_tensor_make(fp8, SFMOE_DTYPE_FP8_E4M3, 1, &elements, SFMOE_MEMORY_CUDA, 0);
  sfmoe_cast_config config = sfmoe_cast_config_init();
  config.scale_device = scale;
  auto cast_or_die = [&](const sfmoe_tensor* a, const sfmoe_tensor* b) {
    if (sfmoe_cast(a, b, &config, stream) != SFMOE_SUCCESS) {
      std::fprintf(stderr, "sfmoe_cast: %s\n", sfmoe_last_error());
      std::exit(2);
    }
  };
  const Timing quant_t = time_runs([&](int) { cast_or_die(&t_bf16, &t_fp8); }, stream);
  const Timing dequant_t = time_runs([&](int) { cast_or_die(&t_fp8, &t_bf16); }, stream);
  const double cast_bytes = 3.0 * elements;
  rows.push_back({"cast bf16 -> fp8 e4m3, 65536x7168, scale in memory", quant_t.median_ms,
                  cast_bytes / (quant_t.median_ms * 1e-3) / 1e12});
  rows.push_back({"cast fp8 e4m3 -> bf16, 65536x7168", dequant_t.median_ms,
                  cast_bytes / (dequant_t.median_ms * 1e-3) / 1e12});
  BENCH_CUDA(cudaFree(bf16));
  BENCH_CUDA(cudaFree(fp8));
  BENCH_CUDA(cudaFree(scale));

  std::printf("\n%-52s %9s %8s %12s %14s\n", "benchmark (median of 25 after 5 warm-up)", "ms",
              "TB/s", "%% ceiling", "%% of 4.17 ref");
  for (const Row& r : rows) {
    std::printf("%-52s %9.3f %8.3f %11.1f%% %13.1f%%\n", r.what.c_str(), r.ms, r.tbps,
                100.0 * r.tbps / ceiling, 100.0 * r.tbps / kReferenceCopyTBps);
    char record[512];
    std::snprintf(
        record, sizeof(record),
        "{\"bench\": \"%s\", \"median_ms\": %.4f, \"TBps\": %.4f, \"ceiling_TBps\": %.4f, "
        "\"reference_TBps\": %.2f}",
        r.what.c_str(), r.ms, r.tbps, ceiling, kReferenceCopyTBps);
    json.add(record);
  }
  std::printf(
      "copy ceiling measured here: %.2f TB/s (../shared/GPU.md reference: %.2f TB/s, ratio %.3f); "
      "our copy kernel / cudaMemcpy = %.3f\n",
      ceiling, kReferenceCopyTBps, ceiling / kReferenceCopyTBps, kernel_tbps / memcpy_tbps);
  cudaStreamDestroy(stream);
  return 0;
}

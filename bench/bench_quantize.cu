// Grouped quantization throughput on [65536 x 7168] BF16 over 128 groups (the sizes of a
// DeepSeek-V3-style permuted activation), each recipe rowwise and rowwise + columnwise.
// Effective bandwidth = (input bytes read + codes and scales written) / time, against the copy
// ceiling measured in this process (cudaMemcpyAsync D2D) and the 4.17 TB/s reference. The plain
// PyTorch figures of the project's GPU notes (FP8 cast 0.34 TB/s, MXFP8 by torch ops 0.16 TB/s)
// are printed for orientation; they were not timed in this process.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "sfmoe/numerics/scale_swizzle.h"
#include "sfmoe/quantize.h"

namespace {

using namespace sfmoe::bench;

__global__ void fill_bf16(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] =
        static_cast<uint16_t>(0x3A00u + (h & 0x07FFu)) | static_cast<uint16_t>((h >> 16) & 0x8000u);
  }
}

struct Case {
  std::string name;
  sfmoe_scaling scaling;
  sfmoe_dtype dtype;
  bool columnwise;
  bool hadamard;
  sfmoe_scale_layout layout;
  bool given_scales = false;  // TENSOR: config.tensor_scales (delayed scaling), one pass
  bool given_amax = false;    // TENSOR, NVFP4: config.group_amax, one pass
};

}  // namespace

int main() {
  // (SFMOE_BENCH_ROWS / SFMOE_BENCH_GROUPS change the shape, for probes; the figures of record
  // are of the default.)
  const int64_t rows =
      std::getenv("SFMOE_BENCH_ROWS") ? std::atoll(std::getenv("SFMOE_BENCH_ROWS")) : 65536;
  const int64_t groups =
      std::getenv("SFMOE_BENCH_GROUPS") ? std::atoll(std::getenv("SFMOE_BENCH_GROUPS")) : 128;
  const int64_t cols = 7168;
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  JsonLog json;

  // Copy ceiling in this process.
  const size_t copy_bytes = size_t(2) << 30;
  void *a = nullptr, *b = nullptr;
  BENCH_CUDA(cudaMalloc(&a, copy_bytes));
  BENCH_CUDA(cudaMalloc(&b, copy_bytes));
  BENCH_CUDA(cudaMemsetAsync(a, 1, copy_bytes, stream));
  const Timing copy = time_runs(
      [&](int) { BENCH_CUDA(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, stream)); },
      stream);
  const double ceiling = 2.0 * copy_bytes / (copy.median_ms * 1e-3) / 1e12;
  BENCH_CUDA(cudaFree(a));
  BENCH_CUDA(cudaFree(b));

  // Group sizes: random around rows / groups, each a multiple of 128 (as permute pads them),
  // summing to `rows`.
  std::mt19937 rng(7);
  std::vector<int64_t> offsets(groups + 1, 0);
  for (int64_t g = 0; g < groups; ++g) offsets[g + 1] = offsets[g] + 128 * (2 + int64_t(rng() % 5));
  const double stretch = double(rows) / offsets[groups];
  for (int64_t g = 1; g <= groups; ++g)
    offsets[g] = std::min<int64_t>(rows, int64_t(offsets[g] * stretch) / 128 * 128);
  offsets[groups] = rows;

  uint16_t* x = nullptr;
  int64_t *in_off = nullptr, *out_off = nullptr;
  uint8_t *row = nullptr, *col = nullptr, *row_s = nullptr, *col_s = nullptr;
  float *amax = nullptr, *camax = nullptr, *given = nullptr;
  const size_t scale_bytes = size_t(rows) * cols / 16 + (1 << 20);
  BENCH_CUDA(cudaMalloc(&x, size_t(rows) * cols * 2));
  BENCH_CUDA(cudaMalloc(&row, size_t(rows) * cols));
  BENCH_CUDA(cudaMalloc(&col, size_t(rows) * cols));
  BENCH_CUDA(cudaMalloc(&row_s, scale_bytes * 4));
  BENCH_CUDA(cudaMalloc(&col_s, scale_bytes * 4));
  BENCH_CUDA(cudaMalloc(&in_off, (groups + 1) * 8));
  BENCH_CUDA(cudaMalloc(&out_off, (groups + 1) * 8));
  BENCH_CUDA(cudaMalloc(&amax, groups * 4));
  BENCH_CUDA(cudaMalloc(&camax, groups * 4));
  BENCH_CUDA(cudaMalloc(&given, groups * 4));
  const std::vector<float> given_host(groups, 64.0f);  // the inputs' magnitudes are below 2
  BENCH_CUDA(cudaMemcpy(given, given_host.data(), groups * 4, cudaMemcpyHostToDevice));
  float* given_amax = nullptr;  // an amax bound for config.group_amax
  BENCH_CUDA(cudaMalloc(&given_amax, groups * 4));
  const std::vector<float> given_amax_host(groups, 2.0f);
  BENCH_CUDA(cudaMemcpy(given_amax, given_amax_host.data(), groups * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(in_off, offsets.data(), (groups + 1) * 8, cudaMemcpyHostToDevice));
  fill_bf16<<<1024, 256, 0, stream>>>(x, rows * cols, 11);

  const Case cases[] = {
      {"fp8 tensor (amax + cast)", SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, false, false,
       SFMOE_SCALE_LAYOUT_COMPACT},
      {"fp8 tensor (amax + cast), +columnwise", SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, true,
       false, SFMOE_SCALE_LAYOUT_COMPACT},
      {"fp8 tensor, given scales (one pass)", SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, false,
       false, SFMOE_SCALE_LAYOUT_COMPACT, true},
      {"fp8 tensor, given scales, +columnwise", SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, true,
       false, SFMOE_SCALE_LAYOUT_COMPACT, true},
      {"fp8 tensor, given amax (one pass)", SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, false,
       false, SFMOE_SCALE_LAYOUT_COMPACT, false, true},
      {"fp8 tensor, given amax, +columnwise", SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, true,
       false, SFMOE_SCALE_LAYOUT_COMPACT, false, true},
      {"fp8 block 1x128", SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3, false, false,
       SFMOE_SCALE_LAYOUT_COMPACT},
      {"fp8 block 1x128, +columnwise", SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3, true, false,
       SFMOE_SCALE_LAYOUT_COMPACT},
      {"fp8 block 1x128, +col, transposed scales", SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3,
       true, false, SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED},
      {"fp8 block 128x128, +columnwise", SFMOE_SCALING_BLOCK_128X128, SFMOE_DTYPE_FP8_E4M3, true,
       false, SFMOE_SCALE_LAYOUT_COMPACT},
      {"mxfp8 1x32", SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E4M3, false, false,
       SFMOE_SCALE_LAYOUT_COMPACT},
      {"mxfp8 1x32, +32x1 columnwise", SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E4M3, true, false,
       SFMOE_SCALE_LAYOUT_COMPACT},
      {"mxfp8, +columnwise, swizzled scales", SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E4M3, true,
       false, SFMOE_SCALE_LAYOUT_SWIZZLED},
      {"nvfp4 1x16", SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, false, false,
       SFMOE_SCALE_LAYOUT_COMPACT},
      {"nvfp4 1x16, +columnwise", SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, true, false,
       SFMOE_SCALE_LAYOUT_COMPACT},
      {"nvfp4 1x16, +columnwise with RHT", SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, true, true,
       SFMOE_SCALE_LAYOUT_COMPACT},
      {"nvfp4 1x16, given amax (one pass)", SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, false,
       false, SFMOE_SCALE_LAYOUT_COMPACT, false, true},
      {"nvfp4 1x16, given amax, +columnwise", SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, true,
       false, SFMOE_SCALE_LAYOUT_COMPACT, false, true},
  };
  char title[96];
  std::snprintf(title, sizeof(title), "grouped quantize [%lld x %lld] bf16, %lld groups",
                static_cast<long long>(rows), static_cast<long long>(cols),
                static_cast<long long>(groups));
  std::printf("\n%-42s %9s %8s %9s %10s\n", title, "ms", "TB/s", "%% ceil", "%% of 4.17");
  const char* filter = std::getenv("SFMOE_BENCH_FILTER");  // run only cases whose name contains it
  for (const Case& c : cases) {
    if (filter && c.name.find(filter) == std::string::npos) continue;
    sfmoe_grouped_tensor in = sfmoe_grouped_tensor_init();
    in.memory = SFMOE_MEMORY_CUDA;
    in.dtype = SFMOE_DTYPE_BF16;
    in.num_groups = groups;
    in.row_capacity = rows;
    in.cols = cols;
    in.row_alignment = 128;
    in.group_offsets = in_off;
    in.rowwise_data = x;
    sfmoe_grouped_tensor q = sfmoe_grouped_tensor_init();
    q.memory = SFMOE_MEMORY_CUDA;
    q.dtype = c.dtype;
    q.scaling = c.scaling;
    q.scale_layout = c.layout;
    q.num_groups = groups;
    q.row_capacity = rows;
    q.cols = cols;
    q.row_alignment = 128;
    q.group_offsets = out_off;
    q.rowwise_data = row;
    q.rowwise_scale_inv = row_s;
    q.columnwise_data = c.columnwise ? col : nullptr;
    q.columnwise_scale_inv = c.columnwise ? col_s : nullptr;
    const bool needs_amax = c.scaling == SFMOE_SCALING_TENSOR || c.dtype == SFMOE_DTYPE_FP4_E2M1;
    q.amax = needs_amax ? amax : nullptr;
    q.columnwise_amax = c.hadamard ? camax : nullptr;
    sfmoe_quantize_config config = sfmoe_quantize_config_init();
    config.hadamard_columnwise = c.hadamard;
    config.tensor_scales = c.given_scales ? given : nullptr;
    config.group_amax = c.given_amax ? given_amax : nullptr;
    if (sfmoe_grouped_quantize(&in, &q, &config, nullptr, stream) != SFMOE_SUCCESS) {
      std::printf("%-42s failed: %s\n", c.name.c_str(), sfmoe_last_error());
      continue;
    }
    const Timing t =
        time_runs([&](int) { sfmoe_grouped_quantize(&in, &q, &config, nullptr, stream); }, stream);
    const double data_bytes = double(rows) * cols * (c.dtype == SFMOE_DTYPE_FP4_E2M1 ? 0.5 : 1.0);
    const int64_t block = c.scaling == SFMOE_SCALING_BLOCK_1X128 ? 128
                          : c.scaling == SFMOE_SCALING_MX_1X32   ? 32
                          : c.dtype == SFMOE_DTYPE_FP4_E2M1      ? 16
                                                                 : 0;
    const double scale_size =
        c.scaling == SFMOE_SCALING_MX_1X32 || c.dtype == SFMOE_DTYPE_FP4_E2M1 ? 1 : 4;
    double scales =
        block ? double(rows) * cols / block * scale_size
              : (c.scaling == SFMOE_SCALING_BLOCK_128X128 ? double(rows) * cols / 16384 * 4
                                                          : groups * 4);
    const double copies = c.columnwise ? 2 : 1;
    const double bytes = double(rows) * cols * 2 + copies * (data_bytes + scales);
    const double tbps = bytes / (t.median_ms * 1e-3) / 1e12;
    std::printf("%-42s %9.3f %8.3f %8.1f%% %9.1f%%\n", c.name.c_str(), t.median_ms, tbps,
                100 * tbps / ceiling, 100 * tbps / kReferenceCopyTBps);
    char record[512];
    std::snprintf(
        record, sizeof(record),
        "{\"bench\": \"%s\", \"median_ms\": %.4f, \"TBps\": %.4f, \"ceiling_TBps\": %.4f}",
        c.name.c_str(), t.median_ms, tbps, ceiling);
    json.add(record);
  }
  std::printf(
      "copy ceiling in this process: %.2f TB/s (reference 4.17). Plain PyTorch (GPU notes, not "
      "this process): "
      "fp8 cast 0.34 TB/s, mxfp8 by torch ops 0.16 TB/s\n",
      ceiling);
  return 0;
}

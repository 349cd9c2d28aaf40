// `sfmoe`: reports the build, the backends and the GPU, then runs a numerics self-check through
// the C API on every available backend (known answers, then CPU vs CUDA bit for bit).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <random>
#include <vector>

#include "sfmoe/cast.h"
#include "sfmoe/numerics.h"
#include "sfmoe/sfmoe.h"
#if defined(SFMOE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

int g_failures = 0;

void check(bool ok, const char* what) {
  printf("  %-58s %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) ++g_failures;
}

// Known answers of the numerics rules (docs/numerics.md).
void known_answers() {
  using namespace sfmoe::numerics;
  printf("numerics known answers\n");
  check(f32_to_e4m3(448.0f) == 0x7E && f32_to_e4m3(1e9f) == 0x7E,
        "e4m3: 448 and 1e9 -> 0x7E (saturate)");
  check(f32_to_e4m3(-0.0f) == 0x80 && f32_to_e4m3(NAN) == 0x7F, "e4m3: -0 -> 0x80, NaN -> 0x7F");
  check(f32_to_e4m3(INFINITY) == 0x7E && f32_to_e4m3(-INFINITY) == 0xFE, "e4m3: +-Inf -> +-448");
  check(f32_to_e5m2(57344.0f) == 0x7B && f32_to_e5m2(1e9f) == 0x7B, "e5m2: 57344 and 1e9 -> 0x7B");
  check(f32_to_e2m1(5.0f) == 0x6 && f32_to_e2m1(-7.0f) == 0xF,
        "e2m1: 5 -> 4 (tie to even), -7 -> -6");
  check(f32_to_bf16(1.00390625f) == 0x3F80, "bf16: 1 + 2^-8 -> 1 (tie to even)");
  check(f32_to_e8m0(1.0f) == 127 && f32_to_e8m0(1.5f) == 128 && f32_to_e8m0(INFINITY) == 254,
        "e8m0: 1 -> 127, 1.5 -> 128, Inf -> 254");
  check(fp8_scale_from_amax(0.0f, 448.0f, false) == 1.0f &&
            fp8_scale_from_amax(2.0f, 448.0f, false) == 224.0f &&
            fp8_scale_from_amax(3.0f, 448.0f, true) == 128.0f,
        "fp8 scale: amax 0 -> 1, 2 -> 224, 3 (pow2) -> 128");
  check(nvfp4_global_encode_scale(2688.0f) == 1.0f && nvfp4_global_encode_scale(0.0f) == 1.0f,
        "nvfp4 global scale: 2688 -> 1, 0 -> 1");
}

// Inputs with the special values every op must survive.
std::vector<float> self_check_inputs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  const float specials[] = {0.0f,   -0.0f,    1e-42f,    -1e-40f, 448.0f, -448.0f, 1e30f,
                            -1e30f, INFINITY, -INFINITY, NAN,     6.0f,   0.25f,   57344.0f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]) && i < n; ++i)
    x[i * 7 % n] = specials[i];
  return x;
}

bool cast_host(const std::vector<float>& x, sfmoe_dtype dtype, float scale,
               std::vector<uint8_t>* q) {
  const int64_t n = static_cast<int64_t>(x.size());
  q->assign((n * sfmoe_dtype_bits(dtype) + 7) / 8 + 16, 0);
  sfmoe_tensor in = sfmoe_tensor_make(const_cast<float*>(x.data()), SFMOE_DTYPE_FP32, 1, &n,
                                      SFMOE_MEMORY_HOST, 0);
  sfmoe_tensor out = sfmoe_tensor_make(q->data(), dtype, 1, &n, SFMOE_MEMORY_HOST, 0);
  sfmoe_cast_config config = sfmoe_cast_config_init();
  config.scale = scale;
  const sfmoe_status s = sfmoe_cast(&in, &out, &config, nullptr);
  if (s != SFMOE_SUCCESS) printf("  sfmoe_cast failed: %s\n", sfmoe_last_error());
  return s == SFMOE_SUCCESS;
}

void cast_checks(bool with_gpu) {
  const uint32_t seed = std::random_device{}();
  const size_t n = 1 << 16;
  const std::vector<float> x = self_check_inputs(n, seed);
  printf("cast through the C API (%zu elements, seed %u)\n", n, seed);
  const sfmoe_dtype dtypes[] = {SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_FP8_E5M2, SFMOE_DTYPE_FP4_E2M1,
                                SFMOE_DTYPE_BF16, SFMOE_DTYPE_FP16};
  for (sfmoe_dtype dtype : dtypes) {
    const float scale = 0.75f;
    std::vector<uint8_t> q;
    bool ok = cast_host(x, dtype, scale, &q);
    // The CPU backend must equal the numerics headers evaluated here, element by element.
    int64_t mismatches = 0;
    for (size_t i = 0; ok && i < n; ++i) {
      const float v = sfmoe::numerics::mul_rn(x[i], scale);
      uint32_t expect = 0, got = 0;
      switch (dtype) {
        case SFMOE_DTYPE_FP8_E4M3:
          expect = sfmoe::numerics::f32_to_e4m3(v);
          got = q[i];
          break;
        case SFMOE_DTYPE_FP8_E5M2:
          expect = sfmoe::numerics::f32_to_e5m2(v);
          got = q[i];
          break;
        case SFMOE_DTYPE_FP4_E2M1:
          expect = sfmoe::numerics::f32_to_e2m1(v);
          got = (q[i / 2] >> (4 * (i & 1))) & 0xF;
          break;
        case SFMOE_DTYPE_BF16:
          expect = sfmoe::numerics::f32_to_bf16(v);
          memcpy(&got, &q[2 * i], 2);
          break;
        default:
          expect = sfmoe::numerics::f32_to_fp16(v);
          memcpy(&got, &q[2 * i], 2);
          break;
      }
      mismatches += expect != got;
    }
    char label[96];
    snprintf(label, sizeof(label), "cpu: fp32 -> %s x0.75 equals the numerics rule",
             sfmoe_dtype_name(dtype));
    check(ok && mismatches == 0, label);
#if defined(SFMOE_WITH_CUDA)
    if (!with_gpu) continue;
    const int64_t count = static_cast<int64_t>(n);
    const size_t out_bytes = (count * sfmoe_dtype_bits(dtype) + 7) / 8;
    float* d_in = nullptr;
    uint8_t* d_out = nullptr;
    bool gpu_ok =
        cudaMalloc(&d_in, n * sizeof(float)) == cudaSuccess &&
        cudaMalloc(&d_out, out_bytes) == cudaSuccess &&
        cudaMemcpy(d_in, x.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess &&
        cudaMemset(d_out, 0xAB, out_bytes) == cudaSuccess;
    sfmoe_tensor in = sfmoe_tensor_make(d_in, SFMOE_DTYPE_FP32, 1, &count, SFMOE_MEMORY_CUDA, 0);
    sfmoe_tensor out = sfmoe_tensor_make(d_out, dtype, 1, &count, SFMOE_MEMORY_CUDA, 0);
    sfmoe_cast_config config = sfmoe_cast_config_init();
    config.scale = scale;
    if (gpu_ok && sfmoe_cast(&in, &out, &config, nullptr) != SFMOE_SUCCESS) {
      printf("  sfmoe_cast (cuda) failed: %s\n", sfmoe_last_error());
      gpu_ok = false;
    }
    std::vector<uint8_t> from_gpu(out_bytes);
    gpu_ok = gpu_ok &&
             cudaMemcpy(from_gpu.data(), d_out, out_bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
    gpu_ok = gpu_ok && memcmp(from_gpu.data(), q.data(), out_bytes) == 0;
    cudaFree(d_in);
    cudaFree(d_out);
    snprintf(label, sizeof(label), "cuda: fp32 -> %s equals the cpu backend bit for bit",
             sfmoe_dtype_name(dtype));
    check(gpu_ok, label);
#else
    (void)with_gpu;
#endif
  }
}

}  // namespace

int main() {
  sfmoe_build_info build;
  build.struct_size = sizeof(build);
  sfmoe_get_build_info(&build);
  sfmoe_device_info device;
  device.struct_size = sizeof(device);
  if (sfmoe_get_device_info(&device) != SFMOE_SUCCESS)
    printf("device query: %s\n", sfmoe_last_error());
  printf("sfmoe %d.%d.%d (%s)\n", build.version_major, build.version_minor, build.version_patch,
         build.compiler);
  printf("backends: cpu%s\n", build.has_cuda_backend ? ", cuda" : "");
  if (build.has_cuda_backend) {
    printf("cuda: built with runtime %d for %s; runtime %d, driver %d\n",
           build.cuda_compiled_version, build.cuda_archs, device.runtime_version,
           device.driver_version);
  }
  const bool with_gpu =
      build.has_cuda_backend && device.device_count > 0 && device.kernels_supported;
  if (device.device_count > 0) {
    printf("gpu: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB%s\n", device.name, device.compute_major,
           device.compute_minor, device.multiprocessors, device.global_memory_bytes / 1073741824.0,
           device.l2_cache_bytes / 1048576.0,
           device.kernels_supported ? "" : " (no kernel image for it in this build)");
  } else {
    printf("gpu: none detected; the self-check runs on the CPU backend only\n");
  }
  known_answers();
  cast_checks(with_gpu);
  printf("self-check: %s\n", g_failures == 0 ? "passed" : "FAILED");
  return g_failures == 0 ? 0 : 1;
}

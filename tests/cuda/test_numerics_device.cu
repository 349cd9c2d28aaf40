// The numerics table evaluated on the device must give the host's bits for every input; and the
// hardware conversion instructions are compared with the software definition, so kernels know
// where they may use them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <curand_philox4x32_x.h>

#include <cstdio>
#include <map>
#include <random>

#include "sfmoe/numerics.h"
#if defined(SFMOE_WITH_CUTE)
#include "src/cuda/layout/scale_swizzle_cute.h"
#endif
#include "tests/cpp/numerics_cases.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

__global__ void eval_numerics_kernel(NumericsFn fn, const uint32_t* a, const uint32_t* b,
                                     uint32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = eval_numerics(fn, a[i], b[i]);
  }
}

TEST(DeviceNumerics, EveryFunctionGivesTheHostBitsOnTheDevice) {
  SFMOE_SKIP_WITHOUT_GPU();
  int64_t total = 0;
  for (const NumericsCase& c : make_numerics_cases(session_test_seed())) {
    const int64_t n = static_cast<int64_t>(c.a.size());
    DeviceBuffer<uint32_t> a(n), b(n), out(n);
    CUDA_OK(a.upload(c.a));
    CUDA_OK(b.upload(c.b));
    CUDA_OK(cudaMemset(out.ptr, 0xFF, n * sizeof(uint32_t)));
    eval_numerics_kernel<<<1024, 256>>>(c.fn, a.ptr, b.ptr, out.ptr, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint32_t> device = out.download();
    ASSERT_EQ(static_cast<int64_t>(device.size()), n);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t host = eval_numerics(c.fn, c.a[i], c.b[i]);
      if (device[i] != host && ++mismatches <= 5) {
        ADD_FAILURE() << c.name << "(0x" << std::hex << c.a[i] << ", 0x" << c.b[i] << "): device 0x"
                      << device[i] << ", host 0x" << host;
      }
    }
    EXPECT_EQ(mismatches, 0) << c.name;
    total += n;
    std::printf("[ device numerics ] %-24s %9lld inputs, %lld differ from the host\n",
                c.name.c_str(), static_cast<long long>(n), static_cast<long long>(mismatches));
  }
  std::printf("[ device numerics ] %lld values evaluated on the device\n",
              static_cast<long long>(total));
}

// --- hardware conversions -------------------------------------------------------------------
__global__ void hardware_convert_kernel(const uint32_t* x, uint32_t* e4m3, uint32_t* e5m2,
                                        uint32_t* bf16, uint32_t* fp16, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = __uint_as_float(x[i]);
    e4m3[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    e5m2[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
    bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    fp16[i] = __half_as_ushort(__float2half_rn(v));
  }
}

// The paired encoders (one instruction for two values) through the library's own functions;
// element i is paired with a partner further along the input so that every input meets others.
__device__ __host__ inline int64_t pair_partner(int64_t i, int64_t n) { return (i * 7919 + 1) % n; }
__global__ void paired_convert_kernel(const uint32_t* x, uint32_t* e4m3x2, uint32_t* e5m2x2,
                                      int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float lo = __uint_as_float(x[i]), hi = __uint_as_float(x[pair_partner(i, n)]);
    e4m3x2[i] = numerics::f32x2_to_e4m3x2(lo, hi);
    e5m2x2[i] = numerics::f32x2_to_e5m2x2(lo, hi);
  }
}

TEST(DeviceNumerics, HardwareConversionsAgreeWithTheDefinition) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::vector<uint32_t> x;
  for (const NumericsCase& c : make_numerics_cases(session_test_seed())) {
    if (c.fn == NumericsFn::kE4M3Encode) x = c.a;
  }
  const int64_t n = static_cast<int64_t>(x.size());
  DeviceBuffer<uint32_t> in(n), e4m3(n), e5m2(n), bf16(n), fp16(n);
  CUDA_OK(in.upload(x));
  hardware_convert_kernel<<<1024, 256>>>(in.ptr, e4m3.ptr, e5m2.ptr, bf16.ptr, fp16.ptr, n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  struct Check {
    const char* name;
    std::vector<uint32_t> hardware;
    uint32_t (*software)(float);
  };
  Check checks[] = {
      {"cvt.rn.satfinite.e4m3x2.f32", e4m3.download(),
       [](float v) -> uint32_t { return numerics::f32_to_e4m3(v); }},
      {"cvt.rn.satfinite.e5m2x2.f32", e5m2.download(),
       [](float v) -> uint32_t { return numerics::f32_to_e5m2(v); }},
      {"cvt.rn.bf16.f32", bf16.download(),
       [](float v) -> uint32_t { return numerics::f32_to_bf16(v); }},
      {"cvt.rn.f16.f32", fp16.download(),
       [](float v) -> uint32_t { return numerics::f32_to_fp16(v); }},
  };
  for (Check& c : checks) {
    ASSERT_EQ(static_cast<int64_t>(c.hardware.size()), n);
    int64_t differ = 0, differ_nan = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = numerics::bits_to_f32(x[i]);
      if (c.hardware[i] != c.software(v)) {
        ++differ;
        if (numerics::f32_is_nan(v)) {
          ++differ_nan;
          continue;
        }
        if (differ - differ_nan <= 5) {
          ADD_FAILURE() << c.name << "(0x" << std::hex << x[i] << "): hardware 0x" << c.hardware[i]
                        << ", definition 0x" << c.software(v);
        }
      }
    }
    std::printf("[ hardware cvt ] %-28s %lld inputs: %lld differ (%lld of them NaN inputs)\n",
                c.name, static_cast<long long>(n), static_cast<long long>(differ),
                static_cast<long long>(differ_nan));
    EXPECT_EQ(differ, 0) << c.name;
  }

  // Pairs: the device's paired conversion against two single conversions on the host.
  DeviceBuffer<uint32_t> e4m3x2(n), e5m2x2(n);
  paired_convert_kernel<<<1024, 256>>>(in.ptr, e4m3x2.ptr, e5m2x2.ptr, n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint32_t> got_e4m3 = e4m3x2.download(), got_e5m2 = e5m2x2.download();
  int64_t pair_differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float lo = numerics::bits_to_f32(x[i]), hi = numerics::bits_to_f32(x[pair_partner(i, n)]);
    const uint32_t want_e4m3 = numerics::f32_to_e4m3(lo) | (numerics::f32_to_e4m3(hi) << 8);
    const uint32_t want_e5m2 = numerics::f32_to_e5m2(lo) | (numerics::f32_to_e5m2(hi) << 8);
    if (got_e4m3[i] != want_e4m3 || got_e5m2[i] != want_e5m2) {
      if (++pair_differ <= 5) {
        ADD_FAILURE() << "pair (0x" << std::hex << x[i] << ", 0x" << x[pair_partner(i, n)]
                      << "): e4m3x2 0x" << got_e4m3[i] << " want 0x" << want_e4m3 << ", e5m2x2 0x"
                      << got_e5m2[i] << " want 0x" << want_e5m2;
      }
    }
  }
  std::printf("[ hardware cvt ] %-28s %lld pairs: %lld differ\n", "f32x2_to_{e4m3,e5m2}x2",
              static_cast<long long>(n), static_cast<long long>(pair_differ));
  EXPECT_EQ(pair_differ, 0);
}

// --- Philox against cuRAND's own implementation ----------------------------------------------
__global__ void philox_kernel(const uint4* counters, const uint2* keys, uint4* ours,
                              uint4* curand_out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const numerics::Philox4x32 r = numerics::philox4x32_10(
      {{counters[i].x, counters[i].y, counters[i].z, counters[i].w}}, keys[i].x, keys[i].y);
  ours[i] = make_uint4(r.v[0], r.v[1], r.v[2], r.v[3]);
  curand_out[i] = curand_Philox4x32_10(counters[i], keys[i]);
}

TEST(DeviceNumerics, PhiloxMatchesCurand) {
  SFMOE_SKIP_WITHOUT_GPU();
  const int n = 1 << 16;
  std::mt19937_64 rng(session_test_seed());
  std::vector<uint4> counters(n);
  std::vector<uint2> keys(n);
  for (int i = 0; i < n; ++i) {
    counters[i] = make_uint4(uint32_t(rng()), uint32_t(rng()), uint32_t(rng()), uint32_t(rng()));
    keys[i] = make_uint2(uint32_t(rng()), uint32_t(rng()));
  }
  DeviceBuffer<uint4> c(n), ours(n), theirs(n);
  DeviceBuffer<uint2> k(n);
  CUDA_OK(c.upload(counters));
  CUDA_OK(k.upload(keys));
  philox_kernel<<<(n + 255) / 256, 256>>>(c.ptr, k.ptr, ours.ptr, theirs.ptr, n);
  CUDA_OK(cudaGetLastError());
  const std::vector<uint4> a = ours.download(), b = theirs.download();
  ASSERT_EQ(a.size(), size_t(n));
  int differ = 0;
  for (int i = 0; i < n; ++i) {
    differ += a[i].x != b[i].x || a[i].y != b[i].y || a[i].z != b[i].z || a[i].w != b[i].w;
  }
  EXPECT_EQ(differ, 0);
  std::printf("[ device numerics ] philox4x32_10 vs cuRAND: %d counters, %d differ\n", n, differ);
}

// --- Hadamard transform: device bits equal host bits -----------------------------------------
__global__ void hadamard_kernel(float* blocks, int n_blocks) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  float v[16];
  for (int i = 0; i < 16; ++i) v[i] = blocks[b * 16 + i];
  numerics::hadamard16_transform(v);
  for (int i = 0; i < 16; ++i) blocks[b * 16 + i] = v[i];
}

TEST(DeviceNumerics, HadamardTransformGivesTheHostBits) {
  SFMOE_SKIP_WITHOUT_GPU();
  const int n_blocks = 1 << 14;
  std::mt19937_64 rng(session_test_seed());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(n_blocks * 16);
  for (auto& v : x) v = normal(rng);
  DeviceBuffer<float> d(x.size());
  CUDA_OK(d.upload(x));
  hadamard_kernel<<<(n_blocks + 127) / 128, 128>>>(d.ptr, n_blocks);
  CUDA_OK(cudaGetLastError());
  const std::vector<float> device = d.download();
  ASSERT_EQ(device.size(), x.size());
  int differ = 0;
  for (int b = 0; b < n_blocks; ++b) {
    float v[16];
    for (int i = 0; i < 16; ++i) v[i] = x[b * 16 + i];
    numerics::hadamard16_transform(v);
    for (int i = 0; i < 16; ++i)
      differ += numerics::f32_to_bits(v[i]) != numerics::f32_to_bits(device[b * 16 + i]);
  }
  EXPECT_EQ(differ, 0);
  std::printf("[ device numerics ] hadamard16: %d blocks, %d values differ\n", n_blocks, differ);
}

// --- the CuTe form of the scale swizzle equals the numerics formula ---------------------------
#if defined(SFMOE_WITH_CUTE)
TEST(DeviceNumerics, CuteSwizzleLayoutEqualsTheFormula) {
  SFMOE_SKIP_WITHOUT_GPU();
  for (int64_t rows : {1, 127, 128, 300, 1000}) {
    for (int64_t cols : {1, 4, 7, 56, 224}) {
      DeviceBuffer<int64_t> offsets(rows * cols);
      ASSERT_EQ(cuda::swizzled_scale_offsets_cute(rows, cols, offsets.ptr, nullptr), SFMOE_SUCCESS)
          << sfmoe_last_error();
      const std::vector<int64_t> got = offsets.download();
      ASSERT_EQ(static_cast<int64_t>(got.size()), rows * cols);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_EQ(got[r * cols + c], numerics::swizzled_scale_offset(r, c, cols))
              << r << "," << c;
        }
      }
    }
  }
}

#endif  // SFMOE_WITH_CUTE

}  // namespace
}  // namespace testing
}  // namespace sfmoe

// The CUDA backend against the CPU backend through the C API, the status word on the device,
// memory-space errors, and the sync-free property: a captured graph replayed on new inputs.
#include <cmath>
#include <cstring>
#include <random>

#include "sfmoe/cast.h"
#include "sfmoe/numerics.h"
#include "tests/cpp/numerics_cases.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

const sfmoe_dtype kFloatDtypes[] = {SFMOE_DTYPE_FP32,     SFMOE_DTYPE_BF16,
                                    SFMOE_DTYPE_FP16,     SFMOE_DTYPE_FP8_E4M3,
                                    SFMOE_DTYPE_FP8_E5M2, SFMOE_DTYPE_FP4_E2M1};

size_t bytes_of(sfmoe_dtype dtype, int64_t n) {
  return static_cast<size_t>((n * sfmoe_dtype_bits(dtype) + 7) / 8);
}

// Random bytes: every code of every dtype appears, NaN and Inf patterns included.
std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

sfmoe_status run_cast(void* in, sfmoe_dtype from, void* out, sfmoe_dtype to, int64_t n,
                      sfmoe_memory memory, float scale, const float* scale_ptr,
                      cudaStream_t stream) {
  sfmoe_tensor a = sfmoe_tensor_make(in, from, 1, &n, memory, 0);
  sfmoe_tensor b = sfmoe_tensor_make(out, to, 1, &n, memory, 0);
  sfmoe_cast_config config = sfmoe_cast_config_init();
  config.scale = scale;
  config.scale_device = scale_ptr;
  return sfmoe_cast(&a, &b, &config, stream);
}

TEST(CudaCast, EveryDtypePairEqualsTheCpuBackendBitForBit) {
  SFMOE_SKIP_WITHOUT_GPU();
  const uint64_t seed = session_test_seed();
  std::mt19937_64 rng(seed);
  int pairs = 0;
  for (int64_t n : {1, 2, 30, 994, 8192, (1 << 20) + 6}) {
    for (sfmoe_dtype from : kFloatDtypes) {
      for (sfmoe_dtype to : kFloatDtypes) {
        if ((from == SFMOE_DTYPE_FP4_E2M1 || to == SFMOE_DTYPE_FP4_E2M1) && n % 2) continue;
        const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4) * 1.25f;
        const std::vector<uint8_t> source = random_bytes(bytes_of(from, n), rng);
        std::vector<uint8_t> expected(bytes_of(to, n) + 64, 0xEE);
        std::vector<uint8_t> host_source(source);
        ASSERT_EQ(run_cast(host_source.data(), from, expected.data(), to, n, SFMOE_MEMORY_HOST,
                           scale, nullptr, nullptr),
                  SFMOE_SUCCESS)
            << sfmoe_last_error();
        DeviceBuffer<uint8_t> d_in(source.size()), d_out(expected.size());
        CUDA_OK(d_in.upload(source));
        CUDA_OK(cudaMemset(d_out.ptr, 0xEE, expected.size()));  // poison, and a canary past the end
        ASSERT_EQ(
            run_cast(d_in.ptr, from, d_out.ptr, to, n, SFMOE_MEMORY_CUDA, scale, nullptr, nullptr),
            SFMOE_SUCCESS)
            << sfmoe_last_error();
        const std::vector<uint8_t> got = d_out.download();
        ASSERT_EQ(got.size(), expected.size());
        EXPECT_EQ(std::memcmp(got.data(), expected.data(), expected.size()), 0)
            << sfmoe_dtype_name(from) << " -> " << sfmoe_dtype_name(to) << " n=" << n;
        ++pairs;
      }
    }
  }
  std::printf("[ cast ] %d (dtype pair, size) cases equal the CPU backend\n", pairs);
}

TEST(CudaCast, MemorySpaceMistakesAreRefusedWithoutWriting) {
  SFMOE_SKIP_WITHOUT_GPU();
  DeviceBuffer<float> d(64);
  CUDA_OK(cudaMemset(d.ptr, 0, 64 * sizeof(float)));
  alignas(16) static float host[64] = {1.0f};
  alignas(16) static uint8_t host_out[64];
  // Device pointer described as host memory.
  EXPECT_EQ(run_cast(d.ptr, SFMOE_DTYPE_FP32, host_out, SFMOE_DTYPE_FP8_E4M3, 64, SFMOE_MEMORY_HOST,
                     1.0f, nullptr, nullptr),
            SFMOE_ERROR_MEMORY_SPACE);
  EXPECT_NE(std::string(sfmoe_last_error()).find("points to CUDA device memory"), std::string::npos)
      << sfmoe_last_error();
  // Host pointer described as CUDA memory.
  EXPECT_EQ(run_cast(host, SFMOE_DTYPE_FP32, d.ptr, SFMOE_DTYPE_FP32, 64, SFMOE_MEMORY_CUDA, 1.0f,
                     nullptr, nullptr),
            SFMOE_ERROR_MEMORY_SPACE);
  EXPECT_NE(std::string(sfmoe_last_error()).find("points to host memory"), std::string::npos)
      << sfmoe_last_error();
  // A CUDA device that does not exist.
  int64_t n = 64;
  sfmoe_tensor t = sfmoe_tensor_make(d.ptr, SFMOE_DTYPE_FP32, 1, &n, SFMOE_MEMORY_CUDA, 99);
  EXPECT_EQ(sfmoe_tensor_validate(&t, "x"), SFMOE_ERROR_INVALID_ARGUMENT);
  const std::vector<float> after = d.download();
  for (float v : after) ASSERT_EQ(v, 0.0f);
}

TEST(CudaStatusWord, GroupOffsetFaultsAreRecordedOnTheDevice) {
  SFMOE_SKIP_WITHOUT_GPU();
  sfmoe_status_word* word = nullptr;
  ASSERT_EQ(sfmoe_status_word_create(SFMOE_MEMORY_CUDA, 0, &word), SFMOE_SUCCESS)
      << sfmoe_last_error();
  DeviceBuffer<int64_t> offsets(1025);
  DeviceBuffer<uint8_t> data(16);
  std::mt19937_64 rng(session_test_seed());
  for (int trial = 0; trial < 20; ++trial) {
    // 1024 groups, aligned to 8 rows, capacity 40000; some trials break a few entries.
    std::vector<int64_t> host(1025, 0);
    for (int g = 1; g <= 1024; ++g) host[g] = host[g - 1] + 8 * int64_t(rng() % 6);
    if (trial % 4 == 1) host[1 + rng() % 1023] += 3;  // misaligned start somewhere
    if (trial % 4 == 2) host[1024] = 40000 + 8;       // last group over capacity
    if (trial % 4 == 3) std::swap(host[100], host[101]), host[100] += 16;  // decreasing
    sfmoe_grouped_tensor t = sfmoe_grouped_tensor_init();
    t.memory = SFMOE_MEMORY_CUDA;
    t.dtype = SFMOE_DTYPE_BF16;
    t.num_groups = 1024;
    t.row_capacity = 40000;
    t.cols = 8;
    t.row_alignment = 8;
    t.group_offsets = offsets.ptr;
    t.rowwise_data = data.ptr;
    CUDA_OK(offsets.upload(host));
    // The same check on the CPU backend is the reference.
    sfmoe_status_word* host_word = nullptr;
    ASSERT_EQ(sfmoe_status_word_create(SFMOE_MEMORY_HOST, 0, &host_word), SFMOE_SUCCESS);
    sfmoe_grouped_tensor th = t;
    th.memory = SFMOE_MEMORY_HOST;
    th.group_offsets = host.data();
    alignas(16) static uint8_t host_data[16];
    th.rowwise_data = host_data;
    ASSERT_EQ(sfmoe_check_group_offsets(&th, host_word, nullptr), SFMOE_SUCCESS)
        << sfmoe_last_error();
    sfmoe_fault_report expected;
    sfmoe_status_word_read(host_word, &expected);
    sfmoe_status_word_destroy(host_word);

    ASSERT_EQ(sfmoe_status_word_reset(word, nullptr), SFMOE_SUCCESS);
    ASSERT_EQ(sfmoe_check_group_offsets(&t, word, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
    ASSERT_EQ(sfmoe_status_word_snapshot(word, nullptr), SFMOE_SUCCESS);
    CUDA_OK(cudaDeviceSynchronize());
    sfmoe_fault_report report;
    ASSERT_EQ(sfmoe_status_word_read(word, &report), SFMOE_SUCCESS);
    EXPECT_EQ(report.flags, expected.flags) << trial;
    EXPECT_EQ(report.count, expected.count) << trial;
    EXPECT_EQ(report.first_group >= 0, expected.first_group >= 0);
    EXPECT_EQ(report.flags != 0, trial % 4 != 0) << trial;
  }
  EXPECT_EQ(sfmoe_status_word_destroy(word), SFMOE_SUCCESS);
}

// The sync-free contract, tested: reset -> offset check -> cast with a scale read from device
// memory -> snapshot, captured once in global mode (a host sync or allocation inside any of
// these calls would invalidate the capture), then replayed on new offsets, scales and data,
// each replay checked against the CPU backend.
TEST(CudaGraph, CapturedOpsReplayOnNewInputsWithoutTheHost) {
  SFMOE_SKIP_WITHOUT_GPU();
  const int64_t n = (1 << 18) + 2, groups = 64, capacity = 1 << 14;
  std::mt19937_64 rng(session_test_seed());
  DeviceBuffer<float> x(n), scale(1);
  DeviceBuffer<uint8_t> q(n), rows(16);
  DeviceBuffer<int64_t> offsets(groups + 1);
  sfmoe_status_word* word = nullptr;
  ASSERT_EQ(sfmoe_status_word_create(SFMOE_MEMORY_CUDA, 0, &word), SFMOE_SUCCESS);
  sfmoe_grouped_tensor t = sfmoe_grouped_tensor_init();
  t.memory = SFMOE_MEMORY_CUDA;
  t.dtype = SFMOE_DTYPE_FP8_E4M3;
  t.scaling = SFMOE_SCALING_TENSOR;
  t.num_groups = groups;
  t.row_capacity = capacity;
  t.cols = 16;
  t.row_alignment = 16;
  t.group_offsets = offsets.ptr;
  t.rowwise_data = rows.ptr;
  t.rowwise_scale_inv = scale.ptr;

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const sfmoe_status s1 = sfmoe_status_word_reset(word, stream);
  const sfmoe_status s2 = sfmoe_check_group_offsets(&t, word, stream);
  const sfmoe_status s3 = run_cast(x.ptr, SFMOE_DTYPE_FP32, q.ptr, SFMOE_DTYPE_FP8_E4M3, n,
                                   SFMOE_MEMORY_CUDA, 0.0f, scale.ptr, stream);
  const sfmoe_status s4 = sfmoe_status_word_snapshot(word, stream);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ASSERT_EQ(s1, SFMOE_SUCCESS) << sfmoe_last_error();
  ASSERT_EQ(s2, SFMOE_SUCCESS) << sfmoe_last_error();
  ASSERT_EQ(s3, SFMOE_SUCCESS) << sfmoe_last_error();
  ASSERT_EQ(s4, SFMOE_SUCCESS) << sfmoe_last_error();
  ASSERT_EQ(end, cudaSuccess) << "capture broke: an op synchronized or allocated: "
                              << cudaGetErrorString(end);
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int replay = 0; replay < 8; ++replay) {
    std::vector<float> hx(n);
    for (auto& v : hx) v = normal(rng) * float(1 + replay);
    hx[replay] = NAN;
    hx[replay + 10] = -INFINITY;
    float amax = 0.0f;
    for (float v : hx)
      if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
    const float hscale = numerics::fp8_scale_from_amax(amax, numerics::kE4M3Max, replay % 2 == 0);
    std::vector<int64_t> hoff(groups + 1, 0);
    for (int g = 1; g <= groups; ++g) hoff[g] = hoff[g - 1] + 16 * int64_t(rng() % 20);
    const bool bad = replay % 3 == 2;
    if (bad) hoff[groups] = capacity + 16;  // this routing overflows: the word must say so
    CUDA_OK(x.upload(hx));
    CUDA_OK(scale.upload(std::vector<float>{hscale}));
    CUDA_OK(offsets.upload(hoff));
    CUDA_OK(cudaMemsetAsync(q.ptr, 0xEE, n, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<uint8_t> got = q.download();
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i)
      differ += got[i] != numerics::f32_to_e4m3(numerics::mul_rn(hx[i], hscale));
    EXPECT_EQ(differ, 0) << "replay " << replay;
    sfmoe_fault_report report;
    ASSERT_EQ(sfmoe_status_word_read(word, &report), SFMOE_SUCCESS);
    EXPECT_EQ(report.flags, bad ? uint32_t(SFMOE_FAULT_GROUP_OVER_CAPACITY) : 0u)
        << "replay " << replay;
    EXPECT_EQ(report.first_group, bad ? groups - 1 : -1) << "replay " << replay;
  }
  std::printf("[ graph ] 8 replays on new data, scales and offsets: all checked\n");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  sfmoe_status_word_destroy(word);
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

// The CPU backend's operations through the C API: cast (every dtype pair, FP4 packing, a scale
// read from memory) and the group-offset check with its status word.
#include <gtest/gtest.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "sfmoe/cast.h"
#include "sfmoe/numerics.h"
#include "src/common/element_codec.h"
#include "tests/cpp/numerics_cases.h"

namespace {

using sfmoe::numerics::bits_to_f32;

const sfmoe_dtype kFloatDtypes[] = {SFMOE_DTYPE_FP32,     SFMOE_DTYPE_BF16,
                                    SFMOE_DTYPE_FP16,     SFMOE_DTYPE_FP8_E4M3,
                                    SFMOE_DTYPE_FP8_E5M2, SFMOE_DTYPE_FP4_E2M1};

std::vector<float> inputs(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  const std::vector<uint32_t> specials = sfmoe::testing::special_f32_bits();
  for (size_t i = 0; i < n; i += 3) x[i] = bits_to_f32(specials[rng() % specials.size()]);
  return x;
}

// Packs FP32 values into `dtype` codes with the numerics headers (independent of the op's loop).
std::vector<uint8_t> encode_all(const std::vector<float>& x, sfmoe_dtype dtype) {
  const int bits = sfmoe_dtype_bits(dtype);
  std::vector<uint8_t> out((x.size() * bits + 7) / 8 + 16, 0);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t code = sfmoe::encode_element(dtype, x[i]);
    if (bits == 4)
      out[i / 2] |= static_cast<uint8_t>((code & 0xF) << (4 * (i & 1)));
    else
      std::memcpy(&out[i * bits / 8], &code, bits / 8);
  }
  return out;
}

TEST(CpuCast, EveryDtypePairMatchesDecodeScaleEncode) {
  const uint64_t seed = sfmoe::testing::session_test_seed();
  for (int64_t n : {0, 1, 2, 30, 994, 4096}) {
    const std::vector<float> x = inputs(static_cast<size_t>(n), seed + n);
    for (sfmoe_dtype from : kFloatDtypes) {
      for (sfmoe_dtype to : kFloatDtypes) {
        if ((from == SFMOE_DTYPE_FP4_E2M1 || to == SFMOE_DTYPE_FP4_E2M1) && n % 2) continue;
        const std::vector<uint8_t> source = encode_all(x, from);
        std::vector<float> decoded(x.size());
        for (int64_t i = 0; i < n; ++i) {
          decoded[i] = sfmoe::numerics::mul_rn(
              sfmoe::decode_element(from,
                                    sfmoe::load_code(source.data(), sfmoe_dtype_bits(from), i)),
              0.375f);
        }
        const std::vector<uint8_t> expected = encode_all(decoded, to);
        alignas(16) std::vector<uint8_t> out(expected.size(), 0xCD);
        std::vector<uint8_t> src_aligned(source);
        sfmoe_tensor in = sfmoe_tensor_make(src_aligned.data(), from, 1, &n, SFMOE_MEMORY_HOST, 0);
        sfmoe_tensor dst = sfmoe_tensor_make(out.data(), to, 1, &n, SFMOE_MEMORY_HOST, 0);
        sfmoe_cast_config config = sfmoe_cast_config_init();
        config.scale = 0.375f;
        ASSERT_EQ(sfmoe_cast(&in, &dst, &config, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
        const size_t used = static_cast<size_t>((n * sfmoe_dtype_bits(to) + 7) / 8);
        EXPECT_EQ(std::memcmp(out.data(), expected.data(), used), 0)
            << sfmoe_dtype_name(from) << " -> " << sfmoe_dtype_name(to) << " n=" << n;
        for (size_t i = used; i < out.size(); ++i) ASSERT_EQ(out[i], 0xCD) << "wrote past the end";
      }
    }
  }
}

TEST(CpuCast, ScaleFromMemoryOverridesTheValue) {
  alignas(16) float x[8] = {1, 2, 3, 4, -1, -2, 0.5f, 100};
  alignas(16) uint8_t q[8];
  const float scale = 4.0f;
  int64_t n = 8;
  sfmoe_tensor in = sfmoe_tensor_make(x, SFMOE_DTYPE_FP32, 1, &n, SFMOE_MEMORY_HOST, 0);
  sfmoe_tensor out = sfmoe_tensor_make(q, SFMOE_DTYPE_FP8_E4M3, 1, &n, SFMOE_MEMORY_HOST, 0);
  sfmoe_cast_config config = sfmoe_cast_config_init();
  config.scale = 1000.0f;  // ignored
  config.scale_device = &scale;
  ASSERT_EQ(sfmoe_cast(&in, &out, &config, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q[i], sfmoe::numerics::f32_to_e4m3(x[i] * 4.0f)) << i;
}

#if defined(__x86_64__)
// A caller running with flush-to-zero and denormals-are-zero (XLA's CPU threads, -ffast-math
// programs) gets the IEEE bits all the same, and its mode back.
TEST(CpuBackend, TheCallersFlushToZeroModeChangesNoBitAndIsRestored) {
  alignas(16) float x[4] = {1e-39f, -3e-40f, 1.5e-38f, 2.0f};  // subnormal inputs
  alignas(16) uint8_t q[4];
  alignas(16) uint16_t b[4];
  int64_t n = 4;
  sfmoe_tensor in = sfmoe_tensor_make(x, SFMOE_DTYPE_FP32, 1, &n, SFMOE_MEMORY_HOST, 0);
  sfmoe_tensor to_fp8 = sfmoe_tensor_make(q, SFMOE_DTYPE_FP8_E4M3, 1, &n, SFMOE_MEMORY_HOST, 0);
  sfmoe_tensor to_bf16 = sfmoe_tensor_make(b, SFMOE_DTYPE_BF16, 1, &n, SFMOE_MEMORY_HOST, 0);
  sfmoe_cast_config scaled = sfmoe_cast_config_init();
  scaled.scale = 1e38f;  // subnormal x scale: normal products (DAZ would read x as 0)
  sfmoe_cast_config plain = sfmoe_cast_config_init();  // subnormal results (FTZ would flush them)
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ | DAZ
  const sfmoe_status s1 = sfmoe_cast(&in, &to_fp8, &scaled, nullptr);
  const sfmoe_status s2 = sfmoe_cast(&in, &to_bf16, &plain, nullptr);
  const unsigned int during = _mm_getcsr();
  _mm_setcsr(saved);
  ASSERT_EQ(s1, SFMOE_SUCCESS) << sfmoe_last_error();
  ASSERT_EQ(s2, SFMOE_SUCCESS) << sfmoe_last_error();
  EXPECT_EQ(during, saved | 0x8040u) << "the caller's mode is given back";
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(q[i], sfmoe::numerics::f32_to_e4m3(x[i] * 1e38f)) << i;
    EXPECT_EQ(b[i], sfmoe::numerics::f32_to_bf16(x[i])) << i;
  }
  EXPECT_NE(q[0], 0u);
  EXPECT_NE(b[0], 0u);
}
#endif

TEST(CpuStatusWord, GroupOffsetChecksRaiseTheRightFaults) {
  sfmoe_status_word* word = nullptr;
  ASSERT_EQ(sfmoe_status_word_create(SFMOE_MEMORY_HOST, 0, &word), SFMOE_SUCCESS);
  alignas(16) uint8_t data[64 * 32];
  struct Case {
    std::vector<int64_t> offsets;
    uint32_t flags;
    int64_t first_group;
  };
  const Case cases[] = {
      {{0, 16, 16, 48, 64}, 0, -1},                               // good, with an empty group
      {{0, 16, 8, 48, 64}, SFMOE_FAULT_BAD_GROUP_OFFSETS, 1},     // decreasing (and misaligned)
      {{0, 16, 32, 48, 80}, SFMOE_FAULT_GROUP_OVER_CAPACITY, 3},  // beyond capacity 64
      {{4, 16, 32, 48, 64}, SFMOE_FAULT_BAD_GROUP_OFFSETS, 0},    // does not start at 0
      {{0, 17, 32, 48, 64}, SFMOE_FAULT_BAD_GROUP_OFFSETS, 1},    // start not aligned to 16
  };
  for (const Case& c : cases) {
    sfmoe_grouped_tensor t = sfmoe_grouped_tensor_init();
    t.memory = SFMOE_MEMORY_HOST;
    t.dtype = SFMOE_DTYPE_BF16;
    t.num_groups = 4;
    t.row_capacity = 64;
    t.cols = 16;
    t.row_alignment = 16;
    std::vector<int64_t> offsets = c.offsets;
    t.group_offsets = offsets.data();
    t.rowwise_data = data;
    ASSERT_EQ(sfmoe_status_word_reset(word, nullptr), SFMOE_SUCCESS);
    ASSERT_EQ(sfmoe_check_group_offsets(&t, word, nullptr), SFMOE_SUCCESS) << sfmoe_last_error();
    ASSERT_EQ(sfmoe_status_word_snapshot(word, nullptr), SFMOE_SUCCESS);
    sfmoe_fault_report report;
    ASSERT_EQ(sfmoe_status_word_read(word, &report), SFMOE_SUCCESS);
    EXPECT_EQ(report.flags, c.flags) << c.offsets[1];
    EXPECT_EQ(report.first_group, c.first_group);
    EXPECT_EQ(report.count == 0, c.flags == 0);
  }
  EXPECT_EQ(sfmoe_status_word_destroy(word), SFMOE_SUCCESS);
}

}  // namespace

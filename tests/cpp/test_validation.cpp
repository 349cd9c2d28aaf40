// Bad descriptors through the C API: each gives its own status and a message that names the
// problem, and nothing is written.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "sfmoe/cast.h"
#include "sfmoe/numerics/float_formats.h"
#include "sfmoe/numerics/scale_swizzle.h"
#include "sfmoe/numerics/scaling.h"
#include "sfmoe/quantize.h"
#include "sfmoe/sfmoe.h"
#include "src/common/error.h"
#include "tests/cpp/host_descriptors.h"

namespace {

struct alignas(64) Buffers {
  float input[64];
  uint8_t output[256];
  int64_t offsets[9];
};

struct BadCase {
  const char* what;
  sfmoe_status expected_status;
  const char* expected_text;  // a phrase the message must contain
  std::function<sfmoe_status(Buffers&)> call;
};

sfmoe_grouped_tensor good_grouped(Buffers& b) {
  sfmoe_grouped_tensor t = sfmoe_grouped_tensor_init();
  t.memory = SFMOE_MEMORY_HOST;
  t.dtype = SFMOE_DTYPE_FP8_E4M3;
  t.scaling = SFMOE_SCALING_MX_1X32;
  t.num_groups = 8;
  t.row_capacity = 4;
  t.cols = 64;
  t.group_offsets = b.offsets;
  t.rowwise_data = b.output;
  t.rowwise_scale_inv = b.output + 128;
  return t;
}

sfmoe_status validate(const sfmoe_grouped_tensor& t) {
  return sfmoe_grouped_tensor_validate(&t, "w1");
}

sfmoe_status cast(sfmoe_tensor in, sfmoe_tensor out) {
  sfmoe_cast_config c = sfmoe_cast_config_init();
  return sfmoe_cast(&in, &out, &c, nullptr);
}

sfmoe_tensor host_tensor(void* data, sfmoe_dtype dtype, int64_t n) {
  return sfmoe_tensor_make(data, dtype, 1, &n, SFMOE_MEMORY_HOST, 0);
}

std::vector<BadCase> bad_cases() {
  return {
    {"null descriptor", SFMOE_ERROR_NULL_POINTER, "descriptor pointer is NULL",
     [](Buffers&) { return sfmoe_grouped_tensor_validate(nullptr, "w1"); }},
        {"struct_size mismatch", SFMOE_ERROR_STRUCT_SIZE, "struct_size is",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.struct_size -= 8;
           return validate(t);
         }},
        {"dtype out of range", SFMOE_ERROR_INVALID_ARGUMENT, "dtype 42 is not a valid",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.dtype = static_cast<sfmoe_dtype>(42);
           return validate(t);
         }},
        {"scaling out of range", SFMOE_ERROR_INVALID_ARGUMENT, "scaling 9 is not a valid",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.scaling = static_cast<sfmoe_scaling>(9);
           return validate(t);
         }},
        {"dtype/scaling mismatch", SFMOE_ERROR_DTYPE_MISMATCH,
         "scaling 'mx_1x32' cannot hold dtype 'bf16'",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.dtype = SFMOE_DTYPE_BF16;
           return validate(t);
         }},
        {"zero groups", SFMOE_ERROR_INVALID_ARGUMENT, "num_groups is 0",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.num_groups = 0;
           return validate(t);
         }},
        {"negative capacity", SFMOE_ERROR_INVALID_ARGUMENT, "row_capacity is -5",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.row_capacity = -5;
           return validate(t);
         }},
        {"zero columns", SFMOE_ERROR_INVALID_ARGUMENT, "cols is 0",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.cols = 0;
           return validate(t);
         }},
        {"alignment not a power of two", SFMOE_ERROR_INVALID_ARGUMENT, "row_alignment is 24",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.row_alignment = 24;
           return validate(t);
         }},
        {"cols not a multiple of the block", SFMOE_ERROR_SHAPE_MISMATCH,
         "not a multiple of the mx_1x32 block width 32",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.cols = 48;
           return validate(t);
         }},
        {"missing group offsets", SFMOE_ERROR_NULL_POINTER, "group_offsets is NULL",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.group_offsets = nullptr;
           return validate(t);
         }},
        {"misaligned group offsets", SFMOE_ERROR_MISALIGNED, "group_offsets",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.group_offsets = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(b.offsets) + 4);
           return validate(t);
         }},
        {"no data at all", SFMOE_ERROR_NULL_POINTER, "neither rowwise_data nor columnwise_data",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.rowwise_data = nullptr;
           return validate(t);
         }},
        {"missing scale_inv", SFMOE_ERROR_NULL_POINTER, "needs rowwise_scale_inv",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.rowwise_scale_inv = nullptr;
           return validate(t);
         }},
        {"misaligned data", SFMOE_ERROR_MISALIGNED, "rowwise_data",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.rowwise_data = b.output + 1;
           return validate(t);
         }},
        {"uniform groups over capacity", SFMOE_ERROR_SHAPE_MISMATCH, "exceed row_capacity",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.uniform_group_rows = 2;
           return validate(t);
         }},
        {"bad memory enum", SFMOE_ERROR_INVALID_ARGUMENT, "memory 7 is not a valid",
         [](Buffers& b) {
           auto t = good_grouped(b);
           t.memory = static_cast<sfmoe_memory>(7);
           return validate(t);
         }},
        {"tensor ndim out of range", SFMOE_ERROR_INVALID_ARGUMENT, "ndim 5 is outside",
         [](Buffers& b) {
           auto t = host_tensor(b.input, SFMOE_DTYPE_FP32, 4);
           t.ndim = 5;
           return sfmoe_tensor_validate(&t, "x");
         }},
        {"tensor negative dimension", SFMOE_ERROR_INVALID_ARGUMENT, "shape[0] = -3 is negative",
         [](Buffers& b) {
           auto t = host_tensor(b.input, SFMOE_DTYPE_FP32, -3);
           return sfmoe_tensor_validate(&t, "x");
         }},
        {"tensor extent past int64 (no element, strides of 2^62)", SFMOE_ERROR_INVALID_ARGUMENT,
         "the shape's extent overflows int64",
         [](Buffers& b) {
           const int64_t shape[2] = {0, int64_t{1} << 62};
           auto t = sfmoe_tensor_make(b.input, SFMOE_DTYPE_FP32, 2, shape, SFMOE_MEMORY_HOST, 0);
           return sfmoe_tensor_validate(&t, "x");
         }},
        {"tensor null data", SFMOE_ERROR_NULL_POINTER, "data is NULL but the tensor has 4 elements",
         [](Buffers&) {
           auto t = host_tensor(nullptr, SFMOE_DTYPE_FP32, 4);
           return sfmoe_tensor_validate(&t, "x");
         }},
        {"fp4 odd innermost dimension", SFMOE_ERROR_SHAPE_MISMATCH,
         "innermost dimension must be even",
         [](Buffers& b) {
           auto t = host_tensor(b.output, SFMOE_DTYPE_FP4_E2M1, 7);
           return sfmoe_tensor_validate(&t, "x");
         }},
        {"cast element count mismatch", SFMOE_ERROR_SHAPE_MISMATCH,
         "input has 8 elements but output has 6",
         [](Buffers& b) {
           return cast(host_tensor(b.input, SFMOE_DTYPE_FP32, 8),
                       host_tensor(b.output, SFMOE_DTYPE_FP8_E4M3, 6));
         }},
        {"cast integer dtype", SFMOE_ERROR_DTYPE_MISMATCH,
         "output dtype 'int32' is not a floating-point",
         [](Buffers& b) {
           return cast(host_tensor(b.input, SFMOE_DTYPE_FP32, 8),
                       host_tensor(b.output, SFMOE_DTYPE_INT32, 8));
         }},
        {"cast config struct_size", SFMOE_ERROR_STRUCT_SIZE, "config struct_size",
         [](Buffers& b) {
           auto in = host_tensor(b.input, SFMOE_DTYPE_FP32, 8),
                out = host_tensor(b.output, SFMOE_DTYPE_FP8_E4M3, 8);
           sfmoe_cast_config c = sfmoe_cast_config_init();
           c.struct_size = 3;
           return sfmoe_cast(&in, &out, &c, nullptr);
         }},
#if !defined(SFMOE_WITH_CUDA)
        {"cuda memory without a CUDA backend", SFMOE_ERROR_NO_BACKEND, "no CUDA backend",
         [](Buffers& b) {
           auto t = host_tensor(b.input, SFMOE_DTYPE_FP32, 4);
           t.memory = SFMOE_MEMORY_CUDA;
           return sfmoe_tensor_validate(&t, "x");
         }},
#endif
  };
}

TEST(Validation, EveryBadDescriptorGivesItsOwnClearErrorAndWritesNothing) {
  std::set<std::string> messages;
  int n = 0;
  for (const BadCase& c : bad_cases()) {
    Buffers b;
    std::memset(&b, 0x5A, sizeof(b));
    for (int g = 0; g <= 8; ++g) b.offsets[g] = 0;
    Buffers before;
    std::memcpy(&before, &b, sizeof(b));
    sfmoe_clear_last_error();
    const sfmoe_status status = c.call(b);
    const std::string message = sfmoe_last_error();
    EXPECT_EQ(status, c.expected_status)
        << c.what << ": " << message << " (" << sfmoe_status_name(status) << ")";
    EXPECT_NE(message.find(c.expected_text), std::string::npos)
        << c.what << ": message \"" << message << "\" lacks \"" << c.expected_text << "\"";
    EXPECT_EQ(std::memcmp(&before, &b, sizeof(b)), 0) << c.what << ": buffers were written";
    EXPECT_TRUE(messages.insert(message).second) << c.what << ": message not distinct";
    ++n;
  }
  EXPECT_GE(n, 10);
  std::printf("[ validation ] %d bad descriptors, %zu distinct messages\n", n, messages.size());
}

TEST(Validation, GoodDescriptorsPass) {
  Buffers b;
  sfmoe_grouped_tensor t = good_grouped(b);
  EXPECT_EQ(validate(t), SFMOE_SUCCESS) << sfmoe_last_error();
  t.uniform_group_rows = 0;
  t.group_offsets = nullptr;
  t.row_capacity = 64;
  t.uniform_group_rows = 8;
  EXPECT_EQ(validate(t), SFMOE_SUCCESS) << sfmoe_last_error();
  sfmoe_tensor x = host_tensor(b.input, SFMOE_DTYPE_FP32, 0);
  EXPECT_EQ(sfmoe_tensor_validate(&x, "x"), SFMOE_SUCCESS);  // empty tensor
  x = host_tensor(nullptr, SFMOE_DTYPE_FP32, 0);
  EXPECT_EQ(sfmoe_tensor_validate(&x, "x"), SFMOE_SUCCESS);  // empty: NULL data is fine
}

// A backend reports a reason naming no public function; the API call it returns through words the
// message once, with its own name. A message the API layer worded is left as it is.
TEST(Validation, BackendReasonsAreWordedByTheApiCall) {
  const sfmoe_status reported = sfmoe::guarded("sfmoe_outer", [] {
    return sfmoe::report(SFMOE_ERROR_CUDA, "kernel_x failed: %s", "cudaErrorLaunchFailure");
  });
  EXPECT_EQ(reported, SFMOE_ERROR_CUDA);
  EXPECT_STREQ(sfmoe_last_error(), "sfmoe_outer: kernel_x failed: cudaErrorLaunchFailure");
  const sfmoe_status nested = sfmoe::guarded("sfmoe_outer", [] {
    return sfmoe::guarded("sfmoe_inner",
                          [] { return sfmoe::report(SFMOE_ERROR_UNSUPPORTED, "no kernel"); });
  });
  EXPECT_EQ(nested, SFMOE_ERROR_UNSUPPORTED);
  EXPECT_STREQ(sfmoe_last_error(), "sfmoe_inner: no kernel");
  sfmoe::guarded("sfmoe_outer", [] {
    return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT, "sfmoe_outer: worded here");
  });
  EXPECT_STREQ(sfmoe_last_error(), "sfmoe_outer: worded here");
  const std::string long_reason(2000, 'r');
  sfmoe::guarded("sfmoe_outer",
                 [&] { return sfmoe::report(SFMOE_ERROR_CUDA, "%s", long_reason.c_str()); });
  EXPECT_EQ(std::string(sfmoe_last_error()).rfind("sfmoe_outer: rrr", 0), 0u);
  EXPECT_EQ(std::strlen(sfmoe_last_error()), 1023u);
  sfmoe_clear_last_error();
  EXPECT_STREQ(sfmoe_last_error(), "");
}

TEST(Validation, StatusNamesAndDtypeTable) {
  EXPECT_STREQ(sfmoe_status_name(SFMOE_ERROR_MISALIGNED), "SFMOE_ERROR_MISALIGNED");
  EXPECT_STREQ(sfmoe_status_name(static_cast<sfmoe_status>(99)), "SFMOE_ERROR_UNKNOWN_STATUS");
  EXPECT_EQ(sfmoe_dtype_bits(SFMOE_DTYPE_FP4_E2M1), 4);
  EXPECT_EQ(sfmoe_dtype_bits(SFMOE_DTYPE_INT64), 64);
  EXPECT_EQ(sfmoe_dtype_bits(static_cast<sfmoe_dtype>(77)), 0);
  EXPECT_STREQ(sfmoe_dtype_name(SFMOE_DTYPE_FP8_E5M2), "fp8_e5m2");
  EXPECT_EQ(sfmoe_scaling_block_size(SFMOE_SCALING_BLOCK_1X128), 128);
  EXPECT_EQ(sfmoe_scaling_block_size(SFMOE_SCALING_MX_1X32), 32);
  EXPECT_EQ(sfmoe_scaling_block_size(SFMOE_SCALING_NV_16X16), 16);
  EXPECT_EQ(sfmoe_scaling_block_size(SFMOE_SCALING_TENSOR), 0);
  EXPECT_EQ(sfmoe_scaling_block_size(static_cast<sfmoe_scaling>(42)), 0);
  EXPECT_EQ(sfmoe_min_row_alignment(SFMOE_SCALING_MX_1X32, 0), 1);
  EXPECT_EQ(sfmoe_min_row_alignment(SFMOE_SCALING_MX_1X32, 1), 32);
  EXPECT_EQ(sfmoe_min_row_alignment(SFMOE_SCALING_BLOCK_128X128, 0), 128);
  EXPECT_EQ(sfmoe_min_row_alignment(SFMOE_SCALING_TENSOR, 1), 1);
}

// The scale storage rules through the C API: what an allocator needs, and refusals that leave the
// outputs alone.
TEST(Validation, ScaleDtypeAndShape) {
  sfmoe_dtype dtype = SFMOE_DTYPE_INT32;
  ASSERT_EQ(sfmoe_scale_dtype(SFMOE_SCALING_BLOCK_1X128, &dtype), SFMOE_SUCCESS);
  EXPECT_EQ(dtype, SFMOE_DTYPE_FP32);
  ASSERT_EQ(sfmoe_scale_dtype(SFMOE_SCALING_MX_1X32, &dtype), SFMOE_SUCCESS);
  EXPECT_EQ(dtype, SFMOE_DTYPE_E8M0);
  ASSERT_EQ(sfmoe_scale_dtype(SFMOE_SCALING_NV_16X16, &dtype), SFMOE_SUCCESS);
  EXPECT_EQ(dtype, SFMOE_DTYPE_FP8_E4M3);
  EXPECT_EQ(sfmoe_scale_dtype(SFMOE_SCALING_NONE, &dtype), SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(dtype, SFMOE_DTYPE_FP8_E4M3);
  EXPECT_EQ(sfmoe_scale_dtype(SFMOE_SCALING_TENSOR, nullptr), SFMOE_ERROR_NULL_POINTER);

  struct Case {
    sfmoe_scaling scaling;
    sfmoe_scale_layout layout;
    int64_t groups, rows, cols;
    int32_t ndim;
    int64_t d0, d1;
  };
  const Case cases[] = {
      {SFMOE_SCALING_TENSOR, SFMOE_SCALE_LAYOUT_COMPACT, 7, 100, 64, 1, 7, 0},
      {SFMOE_SCALING_BLOCK_1X128, SFMOE_SCALE_LAYOUT_COMPACT, 3, 100, 7168, 2, 100, 56},
      {SFMOE_SCALING_BLOCK_1X128, SFMOE_SCALE_LAYOUT_COMPACT, 3, 100, 130, 2, 100, 2},  // rounds up
      {SFMOE_SCALING_BLOCK_128X128, SFMOE_SCALE_LAYOUT_COMPACT, 3, 256, 7168, 2, 2, 56},
      {SFMOE_SCALING_MX_1X32, SFMOE_SCALE_LAYOUT_COMPACT, 3, 33, 96, 2, 33, 3},
      {SFMOE_SCALING_MX_1X32, SFMOE_SCALE_LAYOUT_SWIZZLED, 3, 33, 96, 1, 128 * 4, 0},
      {SFMOE_SCALING_NV_1X16, SFMOE_SCALE_LAYOUT_SWIZZLED, 3, 129, 160, 1, 256 * 12, 0},
      {SFMOE_SCALING_NV_16X16, SFMOE_SCALE_LAYOUT_COMPACT, 3, 32, 48, 2, 2, 3},
      {SFMOE_SCALING_MX_1X32, SFMOE_SCALE_LAYOUT_COMPACT, 3, 0, 0, 2, 0, 0},
  };
  for (const Case& c : cases) {
    int32_t ndim = -1;
    int64_t shape[2] = {-1, -1};
    ASSERT_EQ(sfmoe_scale_shape(c.scaling, c.layout, c.groups, c.rows, c.cols, &ndim, shape),
              SFMOE_SUCCESS)
        << sfmoe_last_error();
    EXPECT_EQ(ndim, c.ndim) << sfmoe_scaling_name(c.scaling);
    EXPECT_EQ(shape[0], c.d0) << sfmoe_scaling_name(c.scaling);
    if (c.ndim == 2) {
      EXPECT_EQ(shape[1], c.d1) << sfmoe_scaling_name(c.scaling);
    }
    // The swizzled size is the numerics formula.
    if (c.layout == SFMOE_SCALE_LAYOUT_SWIZZLED) {
      EXPECT_EQ(shape[0], sfmoe::numerics::swizzled_scale_padded_size(
                              c.rows, c.cols / sfmoe_scaling_block_size(c.scaling)));
    }
  }
  int32_t ndim = -1;
  int64_t shape[2] = {-1, -1};
  EXPECT_EQ(
      sfmoe_scale_shape(SFMOE_SCALING_NONE, SFMOE_SCALE_LAYOUT_COMPACT, 1, 1, 1, &ndim, shape),
      SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sfmoe_scale_shape(SFMOE_SCALING_BLOCK_1X128, SFMOE_SCALE_LAYOUT_SWIZZLED, 1, 1, 128,
                              &ndim, shape),
            SFMOE_ERROR_UNSUPPORTED);
  EXPECT_EQ(
      sfmoe_scale_shape(SFMOE_SCALING_MX_1X32, SFMOE_SCALE_LAYOUT_COMPACT, 1, -1, 32, &ndim, shape),
      SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sfmoe_scale_shape(SFMOE_SCALING_MX_1X32, SFMOE_SCALE_LAYOUT_SWIZZLED, 1, INT64_MAX / 2,
                              INT64_MAX / 2, &ndim, shape),
            SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sfmoe_scale_shape(SFMOE_SCALING_MX_1X32, SFMOE_SCALE_LAYOUT_COMPACT, 1, 1, 32, nullptr,
                              shape),
            SFMOE_ERROR_NULL_POINTER);
  EXPECT_EQ(ndim, -1);  // refusals write nothing
  EXPECT_EQ(shape[0], -1);
}

}  // namespace

namespace sfmoe {
namespace {

// config.tensor_scales: given per-group scales for FP8 per-tensor only, 4-byte aligned; anything
// else is refused before anything is written.
TEST(Validation, GivenTensorScalesAreForPerTensorFp8Only) {
  std::vector<uint16_t> x(4 * 32, 0x3F80);  // BF16 ones
  std::vector<int64_t> in_offsets = {0, 4}, out_offsets = {0, -1};
  std::vector<uint8_t> codes(4 * 32, 0xA5), scales(64, 0x5A);
  std::vector<float> amax(1, -1.0f);
  alignas(8) float given[3] = {2.0f, 2.0f, 2.0f};
  const sfmoe_grouped_tensor in =
      testing::host_rows(x.data(), SFMOE_DTYPE_BF16, 1, 4, 32, 1, in_offsets.data());
  sfmoe_grouped_tensor out =
      testing::host_rows(codes.data(), SFMOE_DTYPE_FP8_E4M3, 1, 4, 32, 1, out_offsets.data());
  out.rowwise_scale_inv = scales.data();
  out.amax = amax.data();
  sfmoe_quantize_config config = sfmoe_quantize_config_init();
  config.tensor_scales = given;
  out.scaling = SFMOE_SCALING_MX_1X32;
  EXPECT_EQ(sfmoe_grouped_quantize(&in, &out, &config, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT)
      << sfmoe_last_error();
  out.scaling = SFMOE_SCALING_TENSOR;
  config.tensor_scales = reinterpret_cast<const float*>(reinterpret_cast<const char*>(given) + 2);
  EXPECT_EQ(sfmoe_grouped_quantize(&in, &out, &config, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT)
      << sfmoe_last_error();
  EXPECT_EQ(codes, std::vector<uint8_t>(4 * 32, 0xA5)) << "refusals write nothing";
  config.tensor_scales = given;
  ASSERT_EQ(sfmoe_grouped_quantize(&in, &out, &config, nullptr, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(codes[0], numerics::f32_to_e4m3(2.0f));  // 1 x the given scale 2
  EXPECT_EQ(amax[0], 1.0f);
}

// config.group_amax: FP8 per-tensor current scaling and NVFP4 only, not with tensor_scales nor
// with NVFP4's Hadamard-transformed columnwise copy, 4-byte aligned, refused by the fused
// quantizations; refusals write nothing, and the given amax is the output amax.
TEST(Validation, GivenGroupAmaxIsForCurrentScalingAndNvfp4Only) {
  std::vector<uint16_t> x(16 * 32, 0x3F80);  // BF16 ones
  std::vector<int64_t> in_offsets = {0, 16}, out_offsets = {0, -1};
  std::vector<uint8_t> codes(16 * 32, 0xA5), col_codes(16 * 32, 0xA5), scales(64, 0x5A),
      col_scales(64, 0x5A);
  std::vector<float> amax(1, -1.0f), col_amax(1, -1.0f);
  alignas(8) float given[3] = {4.0f, 4.0f, 4.0f};
  alignas(8) float scale[1] = {2.0f};
  const sfmoe_grouped_tensor in =
      testing::host_rows(x.data(), SFMOE_DTYPE_BF16, 1, 16, 32, 1, in_offsets.data());
  sfmoe_grouped_tensor out =
      testing::host_rows(codes.data(), SFMOE_DTYPE_FP8_E4M3, 1, 16, 32, 1, out_offsets.data());
  out.rowwise_scale_inv = scales.data();
  out.amax = amax.data();
  sfmoe_quantize_config config = sfmoe_quantize_config_init();
  config.group_amax = given;
  out.scaling = SFMOE_SCALING_MX_1X32;
  EXPECT_EQ(sfmoe_grouped_quantize(&in, &out, &config, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT)
      << sfmoe_last_error();
  out.scaling = SFMOE_SCALING_TENSOR;
  config.tensor_scales = scale;
  EXPECT_EQ(sfmoe_grouped_quantize(&in, &out, &config, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT)
      << sfmoe_last_error();
  config.tensor_scales = nullptr;
  config.group_amax = reinterpret_cast<const float*>(reinterpret_cast<const char*>(given) + 2);
  EXPECT_EQ(sfmoe_grouped_quantize(&in, &out, &config, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT)
      << sfmoe_last_error();
  // NVFP4 with the transformed columnwise copy.
  sfmoe_grouped_tensor nv = out;
  nv.dtype = SFMOE_DTYPE_FP4_E2M1;
  nv.scaling = SFMOE_SCALING_NV_1X16;
  nv.row_alignment = 16;
  nv.columnwise_data = col_codes.data();
  nv.columnwise_scale_inv = col_scales.data();
  nv.columnwise_amax = col_amax.data();
  config.group_amax = given;
  config.hadamard_columnwise = 1;
  EXPECT_EQ(sfmoe_grouped_quantize(&in, &nv, &config, nullptr, nullptr), SFMOE_ERROR_UNSUPPORTED)
      << sfmoe_last_error();
  EXPECT_EQ(codes, std::vector<uint8_t>(16 * 32, 0xA5)) << "refusals write nothing";
  EXPECT_EQ(col_codes, std::vector<uint8_t>(16 * 32, 0xA5)) << "refusals write nothing";
  EXPECT_EQ(amax[0], -1.0f);
  config.hadamard_columnwise = 0;
  ASSERT_EQ(sfmoe_grouped_quantize(&in, &out, &config, nullptr, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(codes[0], numerics::f32_to_e4m3(numerics::mul_rn(
                          1.0f, numerics::fp8_scale_from_amax(4.0f, numerics::kE4M3Max, false))));
  EXPECT_EQ(amax[0], 4.0f) << "the output amax is the given one, not the input's 1";
}

}  // namespace
}  // namespace sfmoe

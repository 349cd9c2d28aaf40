// Grouped quantization: the CUDA backend against the CPU backend (the definition), byte for byte
// over whole buffers poisoned alike beforehand (so "not written" must agree too), for every
// recipe, copy, option and layout; and graph capture with replays on new group sizes.
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "sfmoe/numerics.h"
#include "sfmoe/quantize.h"
#include "src/common/quantize_args.h"
#include "src/cuda/heuristics/launch_overrides.h"
#include "tests/cpp/numerics_cases.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {
namespace {

struct Recipe {
  sfmoe_scaling scaling;
  sfmoe_dtype dtype;
  bool rowwise, columnwise;
  sfmoe_scale_layout layout;
  sfmoe_quantize_config config;
  std::string name;
  bool given_tensor_scales = false;  // TENSOR: config.tensor_scales from given_scales()
  bool given_group_amax = false;     // TENSOR, NVFP4: config.group_amax from given_amaxes()
};

// Given per-tensor scales (delayed scaling) for G groups: powers of two and other values, with
// 0, Inf and NaN among them (each backend uses them as they are).
std::vector<float> given_scales(int64_t groups) {
  std::vector<float> s(groups);
  for (int64_t g = 0; g < groups; ++g) {
    s[g] = std::ldexp(1.0f + static_cast<float>((g * 37) % 64) / 64.0f,
                      static_cast<int>((g * 7) % 24) - 10);
    if (g % 11 == 4) s[g] = INFINITY;
    if (g % 11 == 7) s[g] = 0.0f;
    if (g % 17 == 9) s[g] = std::nanf("");
  }
  return s;
}

// Given group amaxes for G groups: powers of two and other values, with 0, a subnormal, Inf and
// NaN among them (both backends take them as the amax; values beyond them saturate).
std::vector<float> given_amaxes(int64_t groups) {
  std::vector<float> m(groups);
  for (int64_t g = 0; g < groups; ++g) {
    m[g] = std::ldexp(1.0f + static_cast<float>((g * 29) % 64) / 64.0f,
                      static_cast<int>((g * 5) % 20) - 8);
    if (g % 13 == 3) m[g] = 0.0f;
    if (g % 13 == 5) m[g] = std::ldexp(1.0f, -140);
    if (g % 13 == 8) m[g] = INFINITY;
    if (g % 19 == 11) m[g] = std::nanf("");
  }
  return m;
}

// Sizes of the output buffers of a recipe for an [R, C] output with G groups.
struct Sizes {
  size_t rowwise, columnwise, rowwise_scales, columnwise_scales;
};

Sizes sizes_of(const Recipe& rc, int64_t R, int64_t C, int64_t G) {
  const int64_t bits = rc.dtype == SFMOE_DTYPE_FP4_E2M1 ? 4 : 8;
  const int64_t B = scaling_block_size(rc.scaling);
  const size_t data = static_cast<size_t>(R * C * bits / 8);
  const size_t scale_bytes =
      (rc.scaling == SFMOE_SCALING_MX_1X32 || scaling_is_nvfp4(rc.scaling)) ? 1 : 4;
  auto scales = [&](int64_t major, int64_t minor) -> size_t {
    if (rc.scaling == SFMOE_SCALING_TENSOR) return G * 4;
    if (scaling_is_2d(rc.scaling))
      return static_cast<size_t>((major / B) * (minor / B)) * scale_bytes;
    if (rc.layout == SFMOE_SCALE_LAYOUT_SWIZZLED) {
      return static_cast<size_t>(numerics::swizzled_scale_padded_size(major, minor / B));
    }
    return static_cast<size_t>(major * (minor / B)) * scale_bytes;
  };
  return Sizes{data, data, scales(R, C), scales(C, R)};
}

// One quantization problem: input values, input offsets, and the output geometry.
struct Problem {
  int64_t groups, cols, in_capacity, out_capacity, alignment;
  sfmoe_dtype in_dtype;
  std::vector<int64_t> in_offsets;
  std::vector<uint8_t> input;  // [in_capacity, cols] of in_dtype
};

// A problem's geometry for the given group sizes: input offsets, a little unused input capacity
// at the end, an output capacity with room for every group's alignment padding; input zeroed.
Problem problem_of_sizes(const std::vector<int64_t>& sizes, int64_t cols, int64_t alignment,
                         sfmoe_dtype in_dtype) {
  const int64_t groups = static_cast<int64_t>(sizes.size());
  Problem p{groups, cols, 0, 0, alignment, in_dtype, {}, {}};
  p.in_offsets.assign(groups + 1, 0);
  for (int64_t g = 0; g < groups; ++g) p.in_offsets[g + 1] = p.in_offsets[g] + sizes[g];
  p.in_capacity = p.in_offsets[groups] + 5;
  p.out_capacity = (p.in_capacity + groups * (alignment - 1) + 127) / 128 * 128;
  p.input.assign(static_cast<size_t>(p.in_capacity * cols * sfmoe_dtype_bits(in_dtype) / 8), 0);
  return p;
}

// Input element i (row-major over [in_capacity, cols]) set to v in the input's dtype.
void set_input(Problem& p, int64_t i, float v) {
  const int bits = sfmoe_dtype_bits(p.in_dtype);
  const uint32_t code = bits == 32 ? numerics::f32_to_bits(v)
                                   : (p.in_dtype == SFMOE_DTYPE_BF16 ? numerics::f32_to_bf16(v)
                                                                     : numerics::f32_to_fp16(v));
  std::memcpy(&p.input[static_cast<size_t>(i) * bits / 8], &code, bits / 8);
}

Problem make_problem(std::mt19937_64& rng, int64_t groups, int64_t cols, int64_t alignment,
                     sfmoe_dtype in_dtype, int64_t max_group_rows) {
  // The first groups: 1 row, empty, 31, 33, 17 rows, empty (group 0 holds a row so that rows of
  // group 0 meet later groups in a tile).
  const int64_t specials[] = {1, 0, 31, 33, 17, 0};
  std::vector<int64_t> sizes(groups);
  for (int64_t g = 0; g < groups; ++g) {
    sizes[g] = g < 6 ? specials[g] : static_cast<int64_t>(rng() % (max_group_rows + 1));
  }
  Problem p = problem_of_sizes(sizes, cols, alignment, in_dtype);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<uint32_t> special = special_f32_bits();
  for (int64_t i = 0; i < p.in_capacity * cols; ++i) {
    float v = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 16) - 8);
    const uint64_t dice = rng() % 1000;
    if (dice < 3)
      v = numerics::bits_to_f32(special[rng() % special.size()]);  // NaN, Inf, 0, subnormal, max...
    if (dice == 3) v *= 1e4f;                                      // an outlier
    set_input(p, i, v);
  }
  return p;
}

struct Buffers {
  std::vector<uint8_t> rowwise, columnwise, rowwise_scales, columnwise_scales;
  std::vector<float> amax, columnwise_amax;
  std::vector<int64_t> offsets;
};

Buffers poisoned(const Sizes& s, int64_t G) {
  Buffers b;
  b.rowwise.assign(s.rowwise, 0xA5);
  b.columnwise.assign(s.columnwise, 0xA5);
  b.rowwise_scales.assign(s.rowwise_scales + 16, 0xA5);
  b.columnwise_scales.assign(s.columnwise_scales + 16, 0xA5);
  b.amax.assign(G, -7.0f);
  b.columnwise_amax.assign(G, -7.0f);
  b.offsets.assign(G + 1, -9);
  return b;
}

sfmoe_grouped_tensor input_descriptor(const Problem& p, void* data, int64_t* offsets,
                                      sfmoe_memory m) {
  sfmoe_grouped_tensor x = sfmoe_grouped_tensor_init();
  x.memory = m;
  x.dtype = p.in_dtype;
  x.num_groups = p.groups;
  x.row_capacity = p.in_capacity;
  x.cols = p.cols;
  x.group_offsets = offsets;
  x.rowwise_data = data;
  return x;
}

sfmoe_grouped_tensor output_descriptor(const Problem& p, const Recipe& rc, void* rowwise,
                                       void* rowwise_scales, void* columnwise,
                                       void* columnwise_scales, float* amax, float* columnwise_amax,
                                       int64_t* offsets, sfmoe_memory m) {
  sfmoe_grouped_tensor q = sfmoe_grouped_tensor_init();
  q.memory = m;
  q.dtype = rc.dtype;
  q.scaling = rc.scaling;
  q.scale_layout = rc.layout;
  q.num_groups = p.groups;
  q.row_capacity = p.out_capacity;
  q.cols = p.cols;
  q.row_alignment = p.alignment;
  q.group_offsets = offsets;
  q.rowwise_data = rc.rowwise ? rowwise : nullptr;
  q.rowwise_scale_inv = rc.rowwise ? rowwise_scales : nullptr;
  q.columnwise_data = rc.columnwise ? columnwise : nullptr;
  q.columnwise_scale_inv = rc.columnwise ? columnwise_scales : nullptr;
  const bool needs_amax = rc.scaling == SFMOE_SCALING_TENSOR || scaling_is_nvfp4(rc.scaling);
  q.amax = needs_amax ? amax : nullptr;
  q.columnwise_amax = (rc.config.hadamard_columnwise && rc.columnwise) ? columnwise_amax : nullptr;
  return q;
}

template <class T>
size_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;
  }
  return a.size() == b.size() ? SIZE_MAX : std::min(a.size(), b.size());
}

// Quantizes `p` with `rc` on both backends and compares everything; returns true when equal.
// With `faults` set, both backends run with NaN traps on and a status word each, and faults
// receives the CPU's report then the device's.
bool compare_backends(const Problem& p, const Recipe& rc,
                      sfmoe_fault_report (*faults)[2] = nullptr) {
  const Sizes sizes = sizes_of(rc, p.out_capacity, p.cols, p.groups);
  // CPU.
  Buffers cpu = poisoned(sizes, p.groups);
  const std::vector<float> scales = given_scales(p.groups), amaxes = given_amaxes(p.groups);
  sfmoe_quantize_config cpu_config = rc.config, gpu_config = rc.config;
  sfmoe_status_word* words[2] = {nullptr, nullptr};  // host, device
  if (faults != nullptr) {
    cpu_config.trap_nan_amax = gpu_config.trap_nan_amax = 1;
    if (sfmoe_status_word_create(SFMOE_MEMORY_HOST, 0, &words[0]) != SFMOE_SUCCESS ||
        sfmoe_status_word_create(SFMOE_MEMORY_CUDA, 0, &words[1]) != SFMOE_SUCCESS ||
        sfmoe_status_word_reset(words[0], nullptr) != SFMOE_SUCCESS ||
        sfmoe_status_word_reset(words[1], nullptr) != SFMOE_SUCCESS) {
      ADD_FAILURE() << "status words: " << sfmoe_last_error();
      return false;
    }
  }
  struct WordsGone {
    sfmoe_status_word** w;
    ~WordsGone() {
      for (int i = 0; i < 2; ++i)
        if (w[i] != nullptr) sfmoe_status_word_destroy(w[i]);
    }
  } words_gone{words};
  DeviceBuffer<float> d_scales(p.groups), d_amaxes(p.groups);
  if (rc.given_tensor_scales) {
    cpu_config.tensor_scales = scales.data();
    gpu_config.tensor_scales = d_scales.ptr;
    if (d_scales.upload(scales) != cudaSuccess) {
      ADD_FAILURE() << "upload failed";
      return false;
    }
  }
  if (rc.given_group_amax) {
    cpu_config.group_amax = amaxes.data();
    gpu_config.group_amax = d_amaxes.ptr;
    if (d_amaxes.upload(amaxes) != cudaSuccess) {
      ADD_FAILURE() << "upload failed";
      return false;
    }
  }
  std::vector<uint8_t> input_host(p.input);
  std::vector<int64_t> in_offsets_host(p.in_offsets);
  sfmoe_grouped_tensor x =
      input_descriptor(p, input_host.data(), in_offsets_host.data(), SFMOE_MEMORY_HOST);
  sfmoe_grouped_tensor q =
      output_descriptor(p, rc, cpu.rowwise.data(), cpu.rowwise_scales.data(), cpu.columnwise.data(),
                        cpu.columnwise_scales.data(), cpu.amax.data(), cpu.columnwise_amax.data(),
                        cpu.offsets.data(), SFMOE_MEMORY_HOST);
  if (sfmoe_grouped_quantize(&x, &q, &cpu_config, words[0], nullptr) != SFMOE_SUCCESS) {
    ADD_FAILURE() << rc.name << ": cpu: " << sfmoe_last_error();
    return false;
  }
  // CUDA, from buffers poisoned the same way.
  Buffers gpu = poisoned(sizes, p.groups);
  DeviceBuffer<uint8_t> d_in(p.input.size() + 16), d_row(sizes.rowwise + 16),
      d_col(sizes.columnwise + 16), d_rs(gpu.rowwise_scales.size()),
      d_cs(gpu.columnwise_scales.size());
  DeviceBuffer<float> d_amax(p.groups), d_camax(p.groups);
  DeviceBuffer<int64_t> d_in_off(p.groups + 1), d_off(p.groups + 1);
  std::vector<uint8_t> input_padded(p.input);
  input_padded.resize(p.input.size() + 16, 0);
  bool ok =
      d_in.upload(input_padded) == cudaSuccess && d_in_off.upload(p.in_offsets) == cudaSuccess &&
      cudaMemcpy(d_row.ptr, gpu.rowwise.data(), sizes.rowwise, cudaMemcpyHostToDevice) ==
          cudaSuccess &&
      cudaMemcpy(d_col.ptr, gpu.columnwise.data(), sizes.columnwise, cudaMemcpyHostToDevice) ==
          cudaSuccess &&
      d_rs.upload(gpu.rowwise_scales) == cudaSuccess &&
      d_cs.upload(gpu.columnwise_scales) == cudaSuccess && d_amax.upload(gpu.amax) == cudaSuccess &&
      d_camax.upload(gpu.columnwise_amax) == cudaSuccess &&
      d_off.upload(gpu.offsets) == cudaSuccess;
  if (!ok) {
    ADD_FAILURE() << "upload failed";
    return false;
  }
  sfmoe_grouped_tensor xd = input_descriptor(p, d_in.ptr, d_in_off.ptr, SFMOE_MEMORY_CUDA);
  sfmoe_grouped_tensor qd =
      output_descriptor(p, rc, d_row.ptr, d_rs.ptr, d_col.ptr, d_cs.ptr, d_amax.ptr, d_camax.ptr,
                        d_off.ptr, SFMOE_MEMORY_CUDA);
  if (sfmoe_grouped_quantize(&xd, &qd, &gpu_config, words[1], nullptr) != SFMOE_SUCCESS) {
    ADD_FAILURE() << rc.name << ": cuda: " << sfmoe_last_error();
    return false;
  }
  if (faults != nullptr && sfmoe_status_word_snapshot(words[1], nullptr) != SFMOE_SUCCESS) {
    ADD_FAILURE() << rc.name << ": snapshot: " << sfmoe_last_error();
    return false;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    ADD_FAILURE() << rc.name << ": kernel failed: " << cudaGetErrorString(cudaGetLastError());
    return false;
  }
  if (faults != nullptr) {
    for (int i = 0; i < 2; ++i) {
      if (sfmoe_status_word_read(words[i], &(*faults)[i]) != SFMOE_SUCCESS) {
        ADD_FAILURE() << rc.name << ": read: " << sfmoe_last_error();
        return false;
      }
    }
  }
  gpu.rowwise.assign(sizes.rowwise, 0);
  gpu.columnwise.assign(sizes.columnwise, 0);
  cudaMemcpy(gpu.rowwise.data(), d_row.ptr, sizes.rowwise, cudaMemcpyDeviceToHost);
  cudaMemcpy(gpu.columnwise.data(), d_col.ptr, sizes.columnwise, cudaMemcpyDeviceToHost);
  gpu.rowwise_scales = d_rs.download();
  gpu.columnwise_scales = d_cs.download();
  gpu.amax = d_amax.download();
  gpu.columnwise_amax = d_camax.download();
  gpu.offsets = d_off.download();
  bool equal = true;
  auto check = [&](const char* what, size_t at) {
    if (at != SIZE_MAX) {
      ADD_FAILURE() << rc.name << ": " << what << " differs first at index " << at;
      equal = false;
    }
  };
  check("offsets", first_difference(cpu.offsets, gpu.offsets));
  check("amax", first_difference(cpu.amax, gpu.amax));
  check("columnwise_amax", first_difference(cpu.columnwise_amax, gpu.columnwise_amax));
  check("rowwise data", first_difference(cpu.rowwise, gpu.rowwise));
  check("columnwise data", first_difference(cpu.columnwise, gpu.columnwise));
  check("rowwise scales", first_difference(cpu.rowwise_scales, gpu.rowwise_scales));
  check("columnwise scales", first_difference(cpu.columnwise_scales, gpu.columnwise_scales));
  return equal;
}

std::vector<Recipe> all_recipes() {
  std::vector<Recipe> out;
  auto add = [&](sfmoe_scaling s, sfmoe_dtype d, sfmoe_scale_layout layout, sfmoe_quantize_config c,
                 const std::string& name) {
    for (int copies = 0; copies < 3; ++copies) {
      Recipe r{s, d, copies != 1, copies != 0, layout, c, name};
      r.name += copies == 0 ? " rowwise" : (copies == 1 ? " columnwise" : " both");
      out.push_back(r);
    }
  };
  const sfmoe_quantize_config plain = sfmoe_quantize_config_init();
  sfmoe_quantize_config pow2 = plain;
  pow2.power_of_two_scales = 1;
  sfmoe_quantize_config sr = plain;
  sr.stochastic_rounding = 1;
  sr.seed = 0x1234567890ABCDEFull;
  sr.offset = 42;
  sfmoe_quantize_config rht = plain;
  rht.hadamard_columnwise = 1;
  sfmoe_quantize_config sr_rht = sr;
  sr_rht.hadamard_columnwise = 1;
  add(SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALE_LAYOUT_COMPACT, plain,
      "fp8 tensor e4m3");
  add(SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E5M2, SFMOE_SCALE_LAYOUT_COMPACT, pow2,
      "fp8 tensor e5m2 pow2");
  add(SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALE_LAYOUT_COMPACT, plain,
      "fp8 tensor e4m3 given scales");
  for (size_t k = out.size() - 3; k < out.size(); ++k) out[k].given_tensor_scales = true;
  // Given group amaxes: one pass, the scales from the caller's amax.
  add(SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALE_LAYOUT_COMPACT, plain,
      "fp8 tensor e4m3 given amax");
  add(SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, SFMOE_SCALE_LAYOUT_SWIZZLED, sr,
      "nvfp4 1x16 sr swizzled given amax");
  add(SFMOE_SCALING_NV_16X16, SFMOE_DTYPE_FP4_E2M1, SFMOE_SCALE_LAYOUT_COMPACT, plain,
      "nvfp4 16x16 given amax");
  for (size_t k = out.size() - 9; k < out.size(); ++k) out[k].given_group_amax = true;
  add(SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALE_LAYOUT_COMPACT, plain,
      "fp8 1x128");
  add(SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALE_LAYOUT_COMPACT, pow2,
      "fp8 1x128 pow2");
  add(SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E5M2, SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED,
      plain, "fp8 1x128 e5m2 columnwise-transposed");
  add(SFMOE_SCALING_BLOCK_128X128, SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALE_LAYOUT_COMPACT, pow2,
      "fp8 128x128 pow2");
  add(SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALE_LAYOUT_COMPACT, plain, "mxfp8 e4m3");
  add(SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E5M2, SFMOE_SCALE_LAYOUT_SWIZZLED, plain,
      "mxfp8 e5m2 swizzled");
  add(SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, SFMOE_SCALE_LAYOUT_COMPACT, plain, "nvfp4 1x16");
  add(SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, SFMOE_SCALE_LAYOUT_SWIZZLED, sr,
      "nvfp4 1x16 sr swizzled");
  add(SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, SFMOE_SCALE_LAYOUT_COMPACT, rht,
      "nvfp4 1x16 rht");
  add(SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, SFMOE_SCALE_LAYOUT_COMPACT, sr_rht,
      "nvfp4 1x16 sr+rht");
  add(SFMOE_SCALING_NV_16X16, SFMOE_DTYPE_FP4_E2M1, SFMOE_SCALE_LAYOUT_COMPACT, plain,
      "nvfp4 16x16");
  return out;
}

TEST(CudaQuantize, EveryRecipeEqualsTheCpuBackendByteForByte) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed());
  int cases = 0, failures = 0;
  for (const Recipe& rc : all_recipes()) {
    for (sfmoe_dtype in : {SFMOE_DTYPE_BF16, SFMOE_DTYPE_FP32, SFMOE_DTYPE_FP16}) {
      const int64_t needed = min_row_alignment(rc.scaling, rc.columnwise);
      const int64_t alignment = rc.layout == SFMOE_SCALE_LAYOUT_SWIZZLED
                                    ? 128
                                    : std::max<int64_t>(needed, in == SFMOE_DTYPE_FP16 ? 64 : 1);
      const int64_t cols =
          rc.scaling == SFMOE_SCALING_TENSOR ? (in == SFMOE_DTYPE_FP32 ? 100 : 264) : 384;
      const Problem p = make_problem(rng, 13, cols, alignment, in, 300);
      Recipe named = rc;
      named.name +=
          std::string(" from ") + sfmoe_dtype_name(in) + " align " + std::to_string(alignment);
      ++cases;
      if (!compare_backends(p, named)) ++failures;
    }
  }
  std::printf(
      "[ quantize ] %d (recipe, copies, input dtype) cases; %d differ from the CPU backend\n",
      cases, failures);
  EXPECT_EQ(failures, 0);
}

// NaN traps (config.trap_nan_amax) of the 1D block recipes with both copies: one fault per block
// whose amax is NaN, rowwise and columnwise, on both backends (the device's columnwise blocks
// trap from the lane that makes the column's scale, for each scale layout). The count must agree;
// which fault is recorded first depends on the device's order.
TEST(CudaQuantize, NanTrapsOncePerBlockAsTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 3);
  int cases = 0;
  for (const Recipe& rc : all_recipes()) {
    if (!(rc.rowwise && rc.columnwise) ||
        (rc.scaling != SFMOE_SCALING_MX_1X32 && rc.scaling != SFMOE_SCALING_BLOCK_1X128))
      continue;
    const int64_t alignment = rc.layout == SFMOE_SCALE_LAYOUT_SWIZZLED
                                  ? 128
                                  : min_row_alignment(rc.scaling, rc.columnwise);
    Problem p = make_problem(rng, 13, 384, alignment, SFMOE_DTYPE_BF16, 300);
    // NaNs for sure (the random specials leave about one problem in eight without one).
    for (int k = 0; k < 4; ++k) {
      set_input(p,
                static_cast<int64_t>(rng() % static_cast<uint64_t>(p.in_offsets.back() * p.cols)),
                std::nanf(""));
    }
    sfmoe_fault_report faults[2];
    EXPECT_TRUE(compare_backends(p, rc, &faults)) << rc.name;
    EXPECT_EQ(faults[0].flags, uint32_t(SFMOE_FAULT_NAN_AMAX))
        << rc.name << ": NaNs are in the mix";
    EXPECT_GT(faults[0].count, 0u) << rc.name;
    EXPECT_EQ(faults[1].flags, faults[0].flags) << rc.name;
    EXPECT_EQ(faults[1].count, faults[0].count) << rc.name;
    ++cases;
  }
  std::printf("[ quantize ] NaN traps: %d recipes with both copies, one fault per NaN block\n",
              cases);
  EXPECT_GE(cases, 4);
}

// FP8 per-tensor scaling and NVFP4 with the amax row stream (also with runs that cross groups),
// and FP8 with
// given scales, where the codes kernel folds the amax itself: the CPU backend's bytes on small and
// on many-band problems (empty groups, groups of 1, 31 and 33 rows, groups spanning many bands).
// The values are finite except for a NaN in group 7 and an Inf in group 8, so that most groups'
// scales come from real amaxes (the random problems of the other tests put a NaN in most groups).
TEST(CudaQuantize, GroupScalesFromRealAmaxesEqualTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 5);
  struct Shape {
    int64_t groups, cols, max_rows;
  };
  const sfmoe_quantize_config plain = sfmoe_quantize_config_init();
  sfmoe_quantize_config pow2 = plain;
  pow2.power_of_two_scales = 1;
  sfmoe_quantize_config sr_rht = plain;
  sr_rht.stochastic_rounding = 1;
  sr_rht.seed = 77;
  sr_rht.hadamard_columnwise = 1;
  const Recipe recipes[] = {
      {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, true, false, SFMOE_SCALE_LAYOUT_COMPACT, plain,
       "fp8 tensor e4m3 rowwise"},
      // NVFP4's global scales come from the group amax too (with the Hadamard transform, the
      // columnwise amax from the tile kernel's pass whatever the form).
      {SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, true, false, SFMOE_SCALE_LAYOUT_COMPACT, plain,
       "nvfp4 1x16 rowwise"},
      {SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, true, true, SFMOE_SCALE_LAYOUT_COMPACT, sr_rht,
       "nvfp4 1x16 sr+rht both"},
      {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E5M2, true, false, SFMOE_SCALE_LAYOUT_COMPACT, pow2,
       "fp8 tensor e5m2 pow2 rowwise"},
      // Given scales: no amax pass, the amax folded by the codes kernel over many bands.
      {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, true, false, SFMOE_SCALE_LAYOUT_COMPACT, plain,
       "fp8 tensor e4m3 given scales rowwise", true},
      {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, true, true, SFMOE_SCALE_LAYOUT_COMPACT, plain,
       "fp8 tensor e4m3 given scales both", true}};
  int compared = 0;
  for (const Shape shape : {Shape{13, 272, 300}, Shape{97, 512, 600}}) {
    Problem p = make_problem(rng, shape.groups, shape.cols, 16, SFMOE_DTYPE_BF16, shape.max_rows);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t g = 0; g < p.groups; ++g) {
      const float magnitude = std::ldexp(1.0f, static_cast<int>(rng() % 24) - 12);
      for (int64_t r = p.in_offsets[g]; r < p.in_offsets[g + 1]; ++r) {
        for (int64_t c = 0; c < p.cols; ++c) {
          float v = normal(rng) * magnitude;
          if (g == 7 && r == p.in_offsets[g] && c == 3) v = std::nanf("");
          if (g == 8 && r == p.in_offsets[g + 1] - 1 && c == p.cols - 1) v = INFINITY;
          set_input(p, r * p.cols + c, v);
        }
      }
    }
    // The row stream with its own run length, and with runs of 37 rows (which cross the 16-row
    // aligned group starts, so that warps fold several groups and walk past empty ones).
    for (const int64_t rows_per_warp : {int64_t{0}, int64_t{37}}) {
      cuda::launch_overrides_for_tests().amax_rows_per_warp = rows_per_warp;
      for (Recipe rc : recipes) {
        rc.name += std::string(" [") + std::to_string(p.in_offsets.back()) + " x " +
                   std::to_string(p.cols) + "] amax rows per warp " +
                   (rows_per_warp > 0 ? std::to_string(rows_per_warp) : std::string("default"));
        EXPECT_TRUE(compare_backends(p, rc)) << rc.name;
        ++compared;
      }
    }
    cuda::launch_overrides_for_tests().amax_rows_per_warp = 0;
  }
  std::printf(
      "[ quantize ] fp8 tensor and nvfp4 with real amaxes, every amax pass: %d cases compared\n",
      compared);
}

// A problem with the given group sizes and finite values whose magnitude differs per group (so
// that per-tensor scales differ between neighbouring groups).
Problem problem_with_group_magnitudes(std::mt19937_64& rng, const std::vector<int64_t>& sizes,
                                      int64_t cols, int64_t alignment, sfmoe_dtype in_dtype) {
  Problem p = problem_of_sizes(sizes, cols, alignment, in_dtype);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t g = 0; g < p.groups; ++g) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(3 * g) - 6);
    for (int64_t i = p.in_offsets[g] * cols; i < p.in_offsets[g + 1] * cols; ++i) {
      set_input(p, i, normal(rng) * magnitude);
    }
  }
  return p;
}

// FP8 per-tensor scaling with the columnwise copy, where 16-row columnwise pieces hold rows of two
// groups and also the end of the rows (out_off[G]): every row takes its own group's scale. The
// sizes are fixed so that these pieces occur, including the first group ending inside the last
// piece (its rows beyond out_off[G] once made such a piece look like one group).
TEST(CudaQuantize, TensorColumnwisePiecesAcrossGroupsAndTheEnd) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 9);
  const sfmoe_quantize_config plain = sfmoe_quantize_config_init();
  sfmoe_quantize_config pow2 = plain;
  pow2.power_of_two_scales = 1;
  const Recipe recipes[] = {
      {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, true, true, SFMOE_SCALE_LAYOUT_COMPACT, plain,
       "fp8 tensor e4m3 both"},
      {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E5M2, false, true, SFMOE_SCALE_LAYOUT_COMPACT, pow2,
       "fp8 tensor e5m2 pow2 columnwise"},
      {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, true, true, SFMOE_SCALE_LAYOUT_COMPACT, plain,
       "fp8 tensor e4m3 given scales both", true}};
  const std::vector<std::vector<int64_t>> size_sets = {{100, 6},     {5, 3},   {16, 1, 14},
                                                       {7, 0, 9, 2}, {130, 3}, {1, 2, 3, 4, 5}};
  int compared = 0;
  for (const std::vector<int64_t>& sizes : size_sets) {
    for (sfmoe_dtype in : {SFMOE_DTYPE_BF16, SFMOE_DTYPE_FP32}) {
      const Problem p = problem_with_group_magnitudes(rng, sizes, 136, 1, in);
      for (Recipe rc : recipes) {
        rc.name += std::string(" from ") + sfmoe_dtype_name(in) + ", groups";
        for (int64_t n : sizes) rc.name += " " + std::to_string(n);
        EXPECT_TRUE(compare_backends(p, rc)) << rc.name;
        ++compared;
      }
    }
  }
  std::printf("[ quantize ] fp8 tensor columnwise pieces across groups and the end: %d cases\n",
              compared);
}

// Compact columnwise MXFP8 and 1x128 scales, staged over units of eight bands when the capacity
// is a multiple of 1024 rows (whole 32-byte sectors), stored band by band otherwise: the CPU
// backend's bytes where the last unit has fewer bands, the rows end inside a band (MXFP8: inside a
// staged word), the last column tile is partial, and (stored band by band) the capacity is an odd
// number of 32-row blocks.
TEST(CudaQuantize, CompactColumnwiseScalesStagedOverBands) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 13);
  const sfmoe_quantize_config plain = sfmoe_quantize_config_init();
  sfmoe_quantize_config pow2 = plain;
  pow2.power_of_two_scales = 1;
  const Recipe recipes[] = {{SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E4M3, true, true,
                             SFMOE_SCALE_LAYOUT_COMPACT, plain, "mxfp8 e4m3 both"},
                            {SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E5M2, false, true,
                             SFMOE_SCALE_LAYOUT_COMPACT, plain, "mxfp8 e5m2 columnwise"},
                            {SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3, true, true,
                             SFMOE_SCALE_LAYOUT_COMPACT, pow2, "fp8 1x128 pow2 both"}};
  struct Form {
    const char* name;
    bool staged;  // capacity a multiple of 1024 rows
  };
  const Form forms[] = {{"staged", true}, {"off the sectors", false}};
  int compared = 0;
  for (const Form& form : forms) {
    for (const Recipe& base : recipes) {
      for (int shape = 0; shape < 2; ++shape) {
        const bool mx = base.scaling == SFMOE_SCALING_MX_1X32;
        const int64_t cols = mx && shape == 1 ? 160 : 384;  // MXFP8: a partial column tile
        Problem p = make_problem(rng, shape == 0 ? 40 : 7, cols, mx ? 32 : 128, SFMOE_DTYPE_BF16,
                                 shape == 0 ? 300 : 1100);
        if (form.staged) {
          p.out_capacity = (p.out_capacity + 1023) / 1024 * 1024;
        } else if (p.out_capacity % 1024 == 0) {
          p.out_capacity += mx ? 32 : 128;
        }
        if (!form.staged && mx && (p.out_capacity / 32) % 2 == 0) p.out_capacity += 32;  // odd
        Recipe rc = base;
        rc.name += std::string(" [") + std::to_string(p.in_offsets.back()) + " x " +
                   std::to_string(cols) + "], capacity " + std::to_string(p.out_capacity) + ", " +
                   form.name;
        EXPECT_TRUE(compare_backends(p, rc)) << rc.name;
        ++compared;
      }
    }
  }
  std::printf("[ quantize ] compact columnwise scales, staged and not: %d cases compared\n",
              compared);
}

TEST(CudaQuantize, LargeTensorAcrossSixtyFourGroups) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 1);
  // [8192 x 7168] in 64 groups of random sizes (about 8192 rows in all).
  for (const Recipe& rc : all_recipes()) {
    if (!(rc.rowwise && rc.columnwise)) continue;
    if (rc.scaling != SFMOE_SCALING_MX_1X32 && rc.scaling != SFMOE_SCALING_BLOCK_1X128 &&
        rc.name.find("rht") == std::string::npos)
      continue;
    const int64_t alignment =
        rc.layout == SFMOE_SCALE_LAYOUT_SWIZZLED ? 128 : min_row_alignment(rc.scaling, true);
    const Problem p = make_problem(rng, 64, 7168, alignment, SFMOE_DTYPE_BF16, 250);
    EXPECT_TRUE(compare_backends(p, rc)) << rc.name;
    std::printf("[ quantize ] %s on [%lld x 7168], 64 groups: compared\n", rc.name.c_str(),
                static_cast<long long>(p.in_offsets.back()));
  }
}

// Amax, dequantize (both sources) and the scale swizzle: CUDA equals the CPU backend.
TEST(CudaQuantize, AmaxDequantizeAndSwizzleEqualTheCpuBackend) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 3);
  int compared = 0;
  for (const Recipe& rc : all_recipes()) {
    if (!(rc.rowwise && rc.columnwise)) continue;
    const int64_t alignment =
        rc.layout == SFMOE_SCALE_LAYOUT_SWIZZLED ? 128 : min_row_alignment(rc.scaling, true);
    const Problem p = make_problem(rng, 11, 256, alignment, SFMOE_DTYPE_BF16, 150);
    const Sizes sizes = sizes_of(rc, p.out_capacity, p.cols, p.groups);
    // Quantize on the CPU.
    Buffers q = poisoned(sizes, p.groups);
    std::vector<uint8_t> input(p.input);
    std::vector<int64_t> in_off(p.in_offsets);
    sfmoe_grouped_tensor x = input_descriptor(p, input.data(), in_off.data(), SFMOE_MEMORY_HOST);
    sfmoe_grouped_tensor qh =
        output_descriptor(p, rc, q.rowwise.data(), q.rowwise_scales.data(), q.columnwise.data(),
                          q.columnwise_scales.data(), q.amax.data(), q.columnwise_amax.data(),
                          q.offsets.data(), SFMOE_MEMORY_HOST);
    ASSERT_EQ(sfmoe_grouped_quantize(&x, &qh, &rc.config, nullptr, nullptr), SFMOE_SUCCESS)
        << sfmoe_last_error();
    // The same quantized tensor on the device.
    DeviceBuffer<uint8_t> d_row(q.rowwise.size()), d_col(q.columnwise.size()),
        d_rs(q.rowwise_scales.size()), d_cs(q.columnwise_scales.size());
    DeviceBuffer<float> d_amax(p.groups), d_camax(p.groups),
        d_out(static_cast<size_t>(p.out_capacity * p.cols));
    DeviceBuffer<int64_t> d_off(p.groups + 1);
    CUDA_OK(d_row.upload(q.rowwise));
    CUDA_OK(d_col.upload(q.columnwise));
    CUDA_OK(d_rs.upload(q.rowwise_scales));
    CUDA_OK(d_cs.upload(q.columnwise_scales));
    CUDA_OK(d_amax.upload(q.amax));
    CUDA_OK(d_camax.upload(q.columnwise_amax));
    CUDA_OK(d_off.upload(q.offsets));
    sfmoe_grouped_tensor qd =
        output_descriptor(p, rc, d_row.ptr, d_rs.ptr, d_col.ptr, d_cs.ptr, d_amax.ptr, d_camax.ptr,
                          d_off.ptr, SFMOE_MEMORY_CUDA);
    for (sfmoe_dequantize_source source : {SFMOE_DEQUANTIZE_ROWWISE, SFMOE_DEQUANTIZE_COLUMNWISE}) {
      std::vector<float> host_out(static_cast<size_t>(p.out_capacity * p.cols), -3.0f);
      sfmoe_grouped_tensor oh = sfmoe_grouped_tensor_init();
      oh.memory = SFMOE_MEMORY_HOST;
      oh.dtype = SFMOE_DTYPE_FP32;
      oh.num_groups = p.groups;
      oh.row_capacity = p.out_capacity;
      oh.cols = p.cols;
      oh.group_offsets = q.offsets.data();
      oh.rowwise_data = host_out.data();
      ASSERT_EQ(sfmoe_grouped_dequantize(&qh, &oh, source, &rc.config, nullptr), SFMOE_SUCCESS)
          << sfmoe_last_error();
      CUDA_OK(d_out.upload(std::vector<float>(host_out.size(), -3.0f)));
      sfmoe_grouped_tensor od = oh;
      od.memory = SFMOE_MEMORY_CUDA;
      od.group_offsets = d_off.ptr;
      od.rowwise_data = d_out.ptr;
      ASSERT_EQ(sfmoe_grouped_dequantize(&qd, &od, source, &rc.config, nullptr), SFMOE_SUCCESS)
          << sfmoe_last_error();
      const std::vector<float> device_out = d_out.download();
      EXPECT_EQ(first_difference(host_out, device_out), SIZE_MAX)
          << rc.name << " dequantize source " << source;
      ++compared;
    }
    // Grouped amax of the input.
    std::vector<float> host_amax(p.groups, -1.0f);
    ASSERT_EQ(sfmoe_grouped_amax(&x, host_amax.data(), nullptr, nullptr), SFMOE_SUCCESS)
        << sfmoe_last_error();
    DeviceBuffer<uint8_t> d_in(p.input.size());
    DeviceBuffer<int64_t> d_in_off(p.groups + 1);
    CUDA_OK(d_in.upload(p.input));
    CUDA_OK(d_in_off.upload(p.in_offsets));
    sfmoe_grouped_tensor xd = input_descriptor(p, d_in.ptr, d_in_off.ptr, SFMOE_MEMORY_CUDA);
    ASSERT_EQ(sfmoe_grouped_amax(&xd, d_amax.ptr, nullptr, nullptr), SFMOE_SUCCESS)
        << sfmoe_last_error();
    EXPECT_EQ(first_difference(host_amax, d_amax.download()), SIZE_MAX) << rc.name << " amax";
  }
  // Swizzle and unswizzle of random scale bytes, odd sizes.
  for (int64_t rows : {1, 127, 300}) {
    for (int64_t cols : {1, 5, 13}) {
      std::vector<uint8_t> compact(static_cast<size_t>(rows * cols));
      for (auto& b : compact) b = static_cast<uint8_t>(rng());
      const int64_t padded = numerics::swizzled_scale_padded_size(rows, cols);
      std::vector<uint8_t> host_swizzled(static_cast<size_t>(padded), 0xEE),
          host_back(compact.size(), 0xEE);
      int64_t n = static_cast<int64_t>(compact.size());
      sfmoe_tensor hc =
          sfmoe_tensor_make(compact.data(), SFMOE_DTYPE_E8M0, 1, &n, SFMOE_MEMORY_HOST, 0);
      sfmoe_tensor hs = sfmoe_tensor_make(host_swizzled.data(), SFMOE_DTYPE_E8M0, 1, &padded,
                                          SFMOE_MEMORY_HOST, 0);
      sfmoe_tensor hb =
          sfmoe_tensor_make(host_back.data(), SFMOE_DTYPE_E8M0, 1, &n, SFMOE_MEMORY_HOST, 0);
      ASSERT_EQ(sfmoe_swizzle_scales(&hc, rows, cols, &hs, nullptr), SFMOE_SUCCESS)
          << sfmoe_last_error();
      ASSERT_EQ(sfmoe_unswizzle_scales(&hs, rows, cols, &hb, nullptr), SFMOE_SUCCESS)
          << sfmoe_last_error();
      EXPECT_EQ(host_back, compact);
      DeviceBuffer<uint8_t> dc(compact.size()), ds(static_cast<size_t>(padded)), db(compact.size());
      CUDA_OK(dc.upload(compact));
      CUDA_OK(ds.upload(std::vector<uint8_t>(static_cast<size_t>(padded), 0xEE)));
      sfmoe_tensor tc = sfmoe_tensor_make(dc.ptr, SFMOE_DTYPE_E8M0, 1, &n, SFMOE_MEMORY_CUDA, 0);
      sfmoe_tensor ts =
          sfmoe_tensor_make(ds.ptr, SFMOE_DTYPE_E8M0, 1, &padded, SFMOE_MEMORY_CUDA, 0);
      sfmoe_tensor tb = sfmoe_tensor_make(db.ptr, SFMOE_DTYPE_E8M0, 1, &n, SFMOE_MEMORY_CUDA, 0);
      ASSERT_EQ(sfmoe_swizzle_scales(&tc, rows, cols, &ts, nullptr), SFMOE_SUCCESS)
          << sfmoe_last_error();
      ASSERT_EQ(sfmoe_unswizzle_scales(&ts, rows, cols, &tb, nullptr), SFMOE_SUCCESS)
          << sfmoe_last_error();
      EXPECT_EQ(ds.download(), host_swizzled) << rows << "x" << cols;
      EXPECT_EQ(db.download(), compact) << rows << "x" << cols;
    }
  }
  std::printf("[ quantize ] %d dequantize cases, amax and swizzle: CUDA equals the CPU backend\n",
              compared);
}

// Captured once (global mode), replayed on new data and new group sizes: the offsets, the data,
// the scales and the amax of every replay equal the CPU backend's.
TEST(CudaQuantize, CapturedQuantizeReplaysOnNewGroupSizes) {
  SFMOE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(session_test_seed() + 2);
  for (const Recipe& rc : all_recipes()) {
    // (TENSOR rowwise alone too: the row-stream amax pass in the graph.)
    const bool wanted =
        (rc.rowwise && rc.columnwise &&
         (rc.scaling == SFMOE_SCALING_MX_1X32 || rc.name.find("sr+rht") != std::string::npos ||
          rc.scaling == SFMOE_SCALING_TENSOR)) ||
        (rc.scaling == SFMOE_SCALING_TENSOR && rc.rowwise && !rc.columnwise) ||
        (rc.given_group_amax && rc.rowwise && rc.columnwise);
    if (!wanted) continue;
    const int64_t groups = 24, cols = 512,
                  alignment = rc.layout == SFMOE_SCALE_LAYOUT_SWIZZLED ? 128 : 32;
    Problem shape = make_problem(rng, groups, cols, alignment, SFMOE_DTYPE_BF16, 200);
    shape.in_capacity = 24 * 200 + 8;  // fixed bounds for every replay
    shape.out_capacity = (shape.in_capacity + groups * (alignment - 1) + 127) / 128 * 128;
    const Sizes sizes = sizes_of(rc, shape.out_capacity, cols, groups);
    DeviceBuffer<uint8_t> d_in(static_cast<size_t>(shape.in_capacity * cols * 2)),
        d_row(sizes.rowwise), d_col(sizes.columnwise), d_rs(sizes.rowwise_scales + 16),
        d_cs(sizes.columnwise_scales + 16);
    DeviceBuffer<float> d_amax(groups), d_camax(groups);
    DeviceBuffer<int64_t> d_in_off(groups + 1), d_off(groups + 1);
    sfmoe_status_word* word = nullptr;
    ASSERT_EQ(sfmoe_status_word_create(SFMOE_MEMORY_CUDA, 0, &word), SFMOE_SUCCESS);
    sfmoe_grouped_tensor xd = input_descriptor(shape, d_in.ptr, d_in_off.ptr, SFMOE_MEMORY_CUDA);
    sfmoe_grouped_tensor qd =
        output_descriptor(shape, rc, d_row.ptr, d_rs.ptr, d_col.ptr, d_cs.ptr, d_amax.ptr,
                          d_camax.ptr, d_off.ptr, SFMOE_MEMORY_CUDA);
    // Given scales or amaxes: the same arrays in every replay, on each backend's side.
    const std::vector<float> scales = given_scales(groups), amaxes = given_amaxes(groups);
    DeviceBuffer<float> d_scales(groups), d_amaxes(groups);
    CUDA_OK(d_scales.upload(scales));
    CUDA_OK(d_amaxes.upload(amaxes));
    sfmoe_quantize_config gpu_config = rc.config, cpu_config = rc.config;
    if (rc.given_tensor_scales) {
      gpu_config.tensor_scales = d_scales.ptr;
      cpu_config.tensor_scales = scales.data();
    }
    if (rc.given_group_amax) {
      gpu_config.group_amax = d_amaxes.ptr;
      cpu_config.group_amax = amaxes.data();
    }
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const sfmoe_status s1 = sfmoe_status_word_reset(word, stream);
    const sfmoe_status s2 = sfmoe_grouped_quantize(&xd, &qd, &gpu_config, word, stream);
    const sfmoe_status s3 = sfmoe_status_word_snapshot(word, stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    ASSERT_EQ(s2, SFMOE_SUCCESS) << sfmoe_last_error();
    ASSERT_TRUE(s1 == SFMOE_SUCCESS && s3 == SFMOE_SUCCESS);
    ASSERT_EQ(end, cudaSuccess) << "capture broke: " << cudaGetErrorString(end);
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 4; ++replay) {
      Problem p = make_problem(rng, groups, cols, alignment, SFMOE_DTYPE_BF16, 200);
      p.in_capacity = shape.in_capacity;
      p.out_capacity = shape.out_capacity;
      p.input.resize(static_cast<size_t>(p.in_capacity * cols * 2), 0);
      if (replay == 3)
        p.in_offsets[groups] = p.in_capacity + 40;  // over capacity: clamped, flagged
      CUDA_OK(d_in.upload(p.input));
      CUDA_OK(d_in_off.upload(p.in_offsets));
      std::vector<uint8_t> row_poison(sizes.rowwise, 0xA5), col_poison(sizes.columnwise, 0xA5);
      CUDA_OK(d_row.upload(row_poison));
      CUDA_OK(d_col.upload(col_poison));
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      // Reference on the CPU backend.
      Buffers cpu = poisoned(sizes, groups);
      std::vector<uint8_t> input_host(p.input);
      std::vector<int64_t> in_off_host(p.in_offsets);
      sfmoe_grouped_tensor x =
          input_descriptor(p, input_host.data(), in_off_host.data(), SFMOE_MEMORY_HOST);
      sfmoe_grouped_tensor q =
          output_descriptor(p, rc, cpu.rowwise.data(), cpu.rowwise_scales.data(),
                            cpu.columnwise.data(), cpu.columnwise_scales.data(), cpu.amax.data(),
                            cpu.columnwise_amax.data(), cpu.offsets.data(), SFMOE_MEMORY_HOST);
      ASSERT_EQ(sfmoe_grouped_quantize(&x, &q, &cpu_config, nullptr, nullptr), SFMOE_SUCCESS)
          << sfmoe_last_error();
      EXPECT_EQ(d_off.download(), cpu.offsets) << rc.name << " replay " << replay;
      const std::vector<uint8_t> row = d_row.download(), col = d_col.download();
      const int64_t total = cpu.offsets[groups];
      const size_t bits = rc.dtype == SFMOE_DTYPE_FP4_E2M1 ? 4 : 8;
      EXPECT_EQ(
          std::memcmp(row.data(), cpu.rowwise.data(), static_cast<size_t>(total * cols) * bits / 8),
          0)
          << rc.name << " replay " << replay;
      EXPECT_EQ(std::memcmp(col.data(), cpu.columnwise.data(), col.size()), 0)
          << rc.name << " replay " << replay;
      if (rc.scaling == SFMOE_SCALING_TENSOR || scaling_is_nvfp4(rc.scaling)) {
        EXPECT_EQ(std::memcmp(d_amax.download().data(), cpu.amax.data(), groups * 4), 0) << rc.name;
      }
      sfmoe_fault_report report;
      ASSERT_EQ(sfmoe_status_word_read(word, &report), SFMOE_SUCCESS);
      EXPECT_EQ(report.flags, replay == 3 ? uint32_t(SFMOE_FAULT_GROUP_OVER_CAPACITY) : 0u)
          << rc.name << " " << replay;
    }
    std::printf("[ quantize graph ] %s: 4 replays on new group sizes, checked\n", rc.name.c_str());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    sfmoe_status_word_destroy(word);
  }
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe

// The CPU reference of grouped quantization (src/cpu/quantize.cpp) against docs/quantization.md.
// The expectations are restated here from the specification: where each block lies, where its
// scale is stored, which rows are written. Scales must equal the numerics rule applied to the
// block amax computed here; dequantized values must lie within the error bound of the element
// format at the expected scale; bytes the op must not write are poisoned and must survive.
// Inputs are fresh random values each run (the seed is printed; SFMOE_TEST_SEED replays it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sfmoe/numerics.h"
#include "src/common/element_codec.h"
#include "src/cpu/backend.h"
#include "tests/cpp/numerics_cases.h"

namespace {

namespace nm = sfmoe::numerics;
using sfmoe::GroupedDequantizeArgs;
using sfmoe::GroupedInput;
using sfmoe::GroupedQuantizeArgs;

constexpr uint8_t kPoison = 0xA5;
constexpr int64_t kSlack = 64;  // poisoned bytes after every buffer catch writes past its end

// ---- the specification, restated -----------------------------------------------------------

int64_t block_size(sfmoe_scaling scaling) {
  switch (scaling) {
    case SFMOE_SCALING_BLOCK_1X128:
    case SFMOE_SCALING_BLOCK_128X128:
      return 128;
    case SFMOE_SCALING_MX_1X32:
      return 32;
    case SFMOE_SCALING_NV_1X16:
    case SFMOE_SCALING_NV_16X16:
      return 16;
    default:
      return 0;
  }
}
bool is_2d(sfmoe_scaling s) {
  return s == SFMOE_SCALING_BLOCK_128X128 || s == SFMOE_SCALING_NV_16X16;
}
bool is_nvfp4(sfmoe_scaling s) { return s == SFMOE_SCALING_NV_1X16 || s == SFMOE_SCALING_NV_16X16; }
bool has_f32_scales(sfmoe_scaling s) {
  return s == SFMOE_SCALING_TENSOR || s == SFMOE_SCALING_BLOCK_1X128 ||
         s == SFMOE_SCALING_BLOCK_128X128;
}
float fp8_max_of(sfmoe_dtype dtype) {
  return dtype == SFMOE_DTYPE_FP8_E5M2 ? nm::kE5M2Max : nm::kE4M3Max;
}
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

struct Recipe {
  sfmoe_scaling scaling = SFMOE_SCALING_TENSOR;
  sfmoe_dtype dtype = SFMOE_DTYPE_FP8_E4M3;
  bool rowwise = true;
  bool columnwise = true;
  sfmoe_scale_layout layout = SFMOE_SCALE_LAYOUT_COMPACT;
  bool pow2 = false;
  bool stochastic = false;
  bool hadamard = false;

  bool swizzled() const {
    return layout == SFMOE_SCALE_LAYOUT_SWIZZLED &&
           (scaling == SFMOE_SCALING_MX_1X32 || scaling == SFMOE_SCALING_NV_1X16);
  }
  bool transformed(int copy) const {
    return copy == 1 && hadamard && scaling == SFMOE_SCALING_NV_1X16;
  }
  std::string name() const {
    std::ostringstream s;
    s << sfmoe_scaling_name(scaling) << "/" << sfmoe_dtype_name(dtype)
      << (rowwise ? " rowwise" : "") << (columnwise ? " columnwise" : "")
      << (swizzled() ? " swizzled" : "") << (pow2 ? " pow2" : "") << (stochastic ? " sr" : "")
      << (hadamard ? " hadamard" : "");
    return s.str();
  }
};

// Minimum output row alignment (docs/quantization.md, Geometry).
int64_t min_alignment(const Recipe& r) {
  if (r.scaling == SFMOE_SCALING_MX_1X32 && r.columnwise) return 32;
  if (r.scaling == SFMOE_SCALING_NV_1X16 && r.columnwise) return 16;
  if (r.scaling == SFMOE_SCALING_NV_16X16) return 16;
  if (r.scaling == SFMOE_SCALING_BLOCK_1X128 && r.columnwise) return 128;
  if (r.scaling == SFMOE_SCALING_BLOCK_128X128) return 128;
  return 1;
}
// R must be a multiple of this (blocks that run down the rows).
int64_t row_block(const Recipe& r) {
  return (is_2d(r.scaling) || r.columnwise) && block_size(r.scaling) > 0 ? block_size(r.scaling)
                                                                         : 1;
}

// A propagating amax written independently of the numerics header: NaN anywhere gives NaN.
float amax_of(const float* v, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) return std::nanf("");
    m = std::max(m, std::fabs(v[i]));
  }
  return m;
}

// ---- inputs ----------------------------------------------------------------------------------

struct Input {
  sfmoe_dtype dtype = SFMOE_DTYPE_BF16;
  int64_t cols = 0, capacity = 0, uniform = 0;
  std::vector<int64_t> sizes, offsets;
  std::vector<float> values;  // [capacity, cols], exactly representable in dtype
  std::vector<uint8_t> bytes;

  int64_t groups() const { return static_cast<int64_t>(sizes.size()); }
  int64_t begin(int64_t g) const { return uniform > 0 ? g * uniform : offsets[g]; }
  float at(int64_t r, int64_t c) const { return values[r * cols + c]; }
  void set(int64_t r, int64_t c, float v) {
    const int bits = sfmoe_dtype_bits(dtype);
    const uint32_t code = sfmoe::encode_element(dtype, v);
    std::memcpy(&bytes[(r * cols + c) * bits / 8], &code, bits / 8);
    values[r * cols + c] = sfmoe::decode_element(dtype, code);
  }
  GroupedInput view() const {
    return GroupedInput{bytes.data(), dtype, capacity, uniform > 0 ? nullptr : offsets.data(),
                        uniform};
  }
};

struct ValueMix {
  int64_t nonfinite_group = -1;  // a group that gets Inf, -Inf and NaN elements
  int64_t extreme_group = -1;    // a group that gets +-max of the input dtype
  bool constants = true;         // constant rows and constant runs along rows and columns
  int exponent_range = 12;       // row magnitudes 2^[-range, range] (FP16: at most 6)
};

// Input groups of the given sizes (prefix-sum offsets, or uniform rows), plus a few rows past the
// last group filled with NaN: the op must never read them.
Input make_input(std::mt19937_64& rng, sfmoe_dtype dtype, const std::vector<int64_t>& sizes,
                 int64_t cols, bool uniform, const ValueMix& mix = ValueMix()) {
  Input in;
  in.dtype = dtype;
  in.cols = cols;
  in.sizes = sizes;
  if (uniform) {
    in.uniform = sizes.empty() ? 1 : sizes[0];
  } else {
    in.offsets.assign(1, 0);
    for (int64_t n : sizes) in.offsets.push_back(in.offsets.back() + n);
  }
  const int64_t total = uniform ? in.uniform * in.groups() : in.offsets.back();
  in.capacity = total + static_cast<int64_t>(rng() % 5);
  const int bits = sfmoe_dtype_bits(dtype);
  in.values.assign(static_cast<size_t>(in.capacity * cols), 0.0f);
  in.bytes.assign(static_cast<size_t>(in.capacity * cols * bits / 8 + kSlack), 0);
  for (int64_t r = total; r < in.capacity; ++r) {
    for (int64_t c = 0; c < cols; ++c) in.set(r, c, std::nanf(""));
  }

  // Magnitudes vary by row, by column and by outliers, so blocks in either direction have
  // different scales (a misplaced scale shows). FP16 gets a narrower range (max 65504).
  const bool fp16 = dtype == SFMOE_DTYPE_FP16;
  const int range = fp16 ? std::min(mix.exponent_range, 6) : mix.exponent_range;
  std::uniform_int_distribution<int> row_exp(-range, fp16 ? std::min(range, 4) : range);
  std::uniform_int_distribution<int> col_exp(-3, 3);
  std::uniform_int_distribution<int> outlier_exp(6, fp16 ? 6 : 14);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int> col_e(static_cast<size_t>(cols));
  for (auto& e : col_e) e = col_exp(rng);
  const float subnormals[] = {sfmoe::decode_element(dtype, 1u),
                              sfmoe::decode_element(dtype, dtype == SFMOE_DTYPE_FP32   ? 0x400000u
                                                           : dtype == SFMOE_DTYPE_BF16 ? 0x40u
                                                                                       : 0x200u)};
  const uint32_t max_code =
      dtype == SFMOE_DTYPE_FP32 ? 0x7F7FFFFFu : (dtype == SFMOE_DTYPE_BF16 ? 0x7F7Fu : 0x7BFFu);
  const float max_value = sfmoe::decode_element(dtype, max_code);
  for (int64_t r = 0; r < total; ++r) {
    const int re = row_exp(rng);
    const bool constant_row = mix.constants && rng() % 16 == 0;
    const float row_constant = std::ldexp(normal(rng), re);
    for (int64_t c = 0; c < cols; ++c) {
      float v = constant_row ? row_constant : std::ldexp(normal(rng), re + col_e[c]);
      switch (rng() % 200) {
        case 0:
          v = 0.0f;
          break;
        case 1:
          v = -0.0f;
          break;
        case 2:
          v = subnormals[0];
          break;
        case 3:
          v = -subnormals[1];
          break;
        default:
          break;
      }
      in.set(r, c, v);
    }
    // One huge outlier in every other 32-column stretch of the row (so about one per 64
    // elements down a column as well).
    for (int64_t c0 = 0; c0 < cols && !constant_row; c0 += 32) {
      if (rng() % 2) continue;
      const int64_t c = c0 + static_cast<int64_t>(rng() % std::min<int64_t>(32, cols - c0));
      in.set(r, c, std::ldexp(in.at(r, c), outlier_exp(rng)));
    }
    if (mix.constants && cols >= 32 && rng() % 8 == 0) {  // a constant run along the row
      const int64_t c0 = static_cast<int64_t>(rng() % (cols / 32)) * 32;
      for (int64_t c = c0; c < c0 + 32; ++c) in.set(r, c, row_constant);
    }
  }
  if (mix.constants && total >= 32) {  // constant runs down a few columns
    for (int k = 0; k < 8; ++k) {
      const int64_t c = static_cast<int64_t>(rng() % cols);
      const int64_t r0 = static_cast<int64_t>(rng() % (total - 31));
      const float v = std::ldexp(normal(rng), row_exp(rng));
      for (int64_t r = r0; r < r0 + 32; ++r) in.set(r, c, v);
    }
  }
  auto sprinkle = [&](int64_t g, const std::vector<float>& specials) {
    if (g < 0 || g >= in.groups() || in.sizes[g] == 0) return;
    for (float v : specials) {
      const int64_t r = in.begin(g) + static_cast<int64_t>(rng() % in.sizes[g]);
      in.set(r, static_cast<int64_t>(rng() % cols), v);
    }
  };
  const float inf = std::numeric_limits<float>::infinity();
  sprinkle(mix.nonfinite_group, {inf, -inf, std::nanf(""), -std::nanf(""), inf});
  sprinkle(mix.extreme_group, {max_value, -max_value});
  return in;
}

// ---- the quantized tensor (poisoned buffers) -------------------------------------------------

sfmoe_quantize_config make_config(const Recipe& recipe, uint64_t seed, uint64_t offset, bool trap) {
  sfmoe_quantize_config config;
  std::memset(&config, 0, sizeof(config));
  config.struct_size = sizeof(config);
  config.power_of_two_scales = recipe.pow2;
  config.stochastic_rounding = recipe.stochastic;
  config.seed = seed;
  config.offset = offset;
  config.hadamard_columnwise = recipe.hadamard;
  config.trap_nan_amax = trap;
  return config;
}

struct Quantized {
  Recipe recipe;
  int64_t groups = 0, cols = 0, rows = 0, alignment = 1, uniform = 0;
  sfmoe_quantize_config config{};
  std::vector<int64_t> offsets;  // groups + 1, then slack, poisoned
  std::vector<uint8_t> data[2], scales[2], amax, columnwise_amax;

  bool has(int copy) const { return copy == 0 ? recipe.rowwise : recipe.columnwise; }
  int64_t copy_rows(int copy) const { return copy == 0 ? rows : cols; }
  int64_t copy_cols(int copy) const { return copy == 0 ? cols : rows; }
  int64_t data_bytes() const { return rows * cols * sfmoe_dtype_bits(recipe.dtype) / 8; }
  int64_t scale_cols(int copy) const { return copy_cols(copy) / block_size(recipe.scaling); }
  // Bytes of the scale storage of a copy (docs/quantization.md, the recipe table).
  int64_t scale_bytes(int copy) const {
    const int64_t b = block_size(recipe.scaling);
    switch (recipe.scaling) {
      case SFMOE_SCALING_TENSOR:
        return groups * 4;
      case SFMOE_SCALING_BLOCK_1X128:
        return copy_rows(copy) * scale_cols(copy) * 4;
      case SFMOE_SCALING_BLOCK_128X128:
        return (rows / b) * (cols / b) * 4;
      case SFMOE_SCALING_NV_16X16:
        return (rows / b) * (cols / b);
      default:
        return recipe.swizzled() ? nm::swizzled_scale_padded_size(copy_rows(copy), scale_cols(copy))
                                 : copy_rows(copy) * scale_cols(copy);
    }
  }

  GroupedQuantizeArgs args(const Input& in, sfmoe_fault_report* word) {
    GroupedQuantizeArgs a;
    std::memset(&a, 0, sizeof(a));
    a.input = in.view();
    a.num_groups = groups;
    a.cols = cols;
    a.dtype = recipe.dtype;
    a.scaling = recipe.scaling;
    a.scale_layout = recipe.layout;
    a.row_capacity = rows;
    a.row_alignment = alignment;
    a.offsets = offsets.data();  // also with uniform groups: it must stay untouched
    a.uniform_rows = uniform;
    if (recipe.rowwise) {
      a.rowwise = data[0].data();
      a.rowwise_scale_inv = scales[0].data();
    }
    if (recipe.columnwise) {
      a.columnwise = data[1].data();
      a.columnwise_scale_inv = scales[1].data();
    }
    a.amax = reinterpret_cast<float*>(amax.data());
    a.columnwise_amax = reinterpret_cast<float*>(columnwise_amax.data());
    a.config = config;
    a.word = word;
    return a;
  }
};

int64_t poisoned_i64() {
  int64_t v;
  std::memset(&v, kPoison, sizeof(v));
  return v;
}

// Allocates the output for `in` with alignment `a` and `extra_rows` rows beyond the required
// capacity, and runs the op.
Quantized quantize(const Input& in, const Recipe& recipe, int64_t a, int64_t extra_rows,
                   const sfmoe_quantize_config& config, sfmoe_fault_report* word = nullptr) {
  Quantized q;
  q.recipe = recipe;
  q.groups = in.groups();
  q.cols = in.cols;
  q.alignment = a;
  q.uniform = in.uniform;
  const int64_t required =
      in.uniform > 0 ? in.uniform * in.groups() : in.capacity + in.groups() * (a - 1);
  q.rows = round_up(required + extra_rows, row_block(recipe));
  q.config = config;
  q.offsets.assign(static_cast<size_t>(q.groups + 1 + 4), poisoned_i64());
  for (int copy = 0; copy < 2; ++copy) {
    if (!q.has(copy)) continue;
    q.data[copy].assign(static_cast<size_t>(q.data_bytes() + kSlack), kPoison);
    q.scales[copy].assign(static_cast<size_t>(q.scale_bytes(copy) + kSlack), kPoison);
  }
  q.amax.assign(static_cast<size_t>(q.groups * 4 + kSlack), kPoison);
  q.columnwise_amax.assign(static_cast<size_t>(q.groups * 4 + kSlack), kPoison);
  sfmoe::cpu::grouped_quantize(q.args(in, word));
  return q;
}

// Dequantizes one copy into a poisoned FP32 (or other) buffer [R, C] (+ slack).
std::vector<uint8_t> dequantize(Quantized& q, const Input& in, int copy,
                                sfmoe_dtype out_dtype = SFMOE_DTYPE_FP32) {
  std::vector<uint8_t> out(
      static_cast<size_t>(q.rows * q.cols * sfmoe_dtype_bits(out_dtype) / 8 + kSlack), kPoison);
  GroupedDequantizeArgs d;
  std::memset(&d, 0, sizeof(d));
  d.quantized = q.args(in, nullptr);
  if (q.uniform > 0) d.quantized.offsets = nullptr;
  d.from_columnwise = copy == 1;
  d.output = out.data();
  d.output_dtype = out_dtype;
  sfmoe::cpu::grouped_dequantize(d);
  return out;
}

float f32_at(const std::vector<uint8_t>& bytes, int64_t i) {
  float v;
  std::memcpy(&v, &bytes[i * 4], 4);
  return v;
}

uint32_t code_at(const std::vector<uint8_t>& data, sfmoe_dtype dtype, int64_t i) {
  return sfmoe::load_code(data.data(), sfmoe_dtype_bits(dtype), i);
}

// Entry index of the scale of output element (r, c), of group g, in a copy's scale buffer
// (docs/quantization.md, the recipe table).
int64_t scale_entry(const Quantized& q, int copy, int64_t r, int64_t c, int64_t g) {
  const int64_t B = block_size(q.recipe.scaling), R = q.rows, C = q.cols;
  switch (q.recipe.scaling) {
    case SFMOE_SCALING_TENSOR:
      return g;
    case SFMOE_SCALING_BLOCK_128X128:
    case SFMOE_SCALING_NV_16X16:
      return copy == 0 ? (r / B) * (C / B) + c / B : (c / B) * (R / B) + r / B;
    default: {
      const int64_t row = copy == 0 ? r : c, k = copy == 0 ? c / B : r / B;
      const int64_t scale_cols = q.scale_cols(copy);
      return q.recipe.swizzled() ? nm::swizzled_scale_offset(row, k, scale_cols)
                                 : row * scale_cols + k;
    }
  }
}

// The stored scale (FP32 bits or the byte) of an entry.
uint32_t scale_value(const Quantized& q, int copy, int64_t entry) {
  if (has_f32_scales(q.recipe.scaling)) return nm::f32_to_bits(f32_at(q.scales[copy], entry));
  return q.scales[copy][entry];
}

// The elements that share the scale of element (r, c) in a copy (1D and 2D blocks).
std::vector<std::pair<int64_t, int64_t>> block_elements(const Quantized& q, int copy, int64_t r,
                                                        int64_t c) {
  const int64_t B = block_size(q.recipe.scaling);
  std::vector<std::pair<int64_t, int64_t>> v;
  if (is_2d(q.recipe.scaling)) {
    for (int64_t i = r / B * B; i < r / B * B + B; ++i) {
      for (int64_t j = c / B * B; j < c / B * B + B; ++j) v.emplace_back(i, j);
    }
  } else if (copy == 0) {
    for (int64_t j = c / B * B; j < c / B * B + B; ++j) v.emplace_back(r, j);
  } else {
    for (int64_t i = r / B * B; i < r / B * B + B; ++i) v.emplace_back(i, c);
  }
  return v;
}

// ---- what the specification says the op produces ---------------------------------------------

struct Oracle {
  int64_t end = 0;
  std::vector<int64_t> out_off, group_of_row;
  std::vector<uint8_t> padding_row;
  std::vector<float> x;  // the padded matrix [end, C]
  std::vector<float> group_amax, columnwise_amax;
  struct Copy {
    // Per element (r, c) of the padded matrix: the value encoded (after the transform), the
    // multiplier, the decode factor, and whether its block (and group) amax is finite.
    std::vector<float> value, multiplier, factor;
    std::vector<uint8_t> finite;
    std::vector<int> scale;  // expected byte of the scale buffer; -1: must stay poisoned
  } copy[2];
};

std::vector<int64_t> expected_out_off(const Input& in, int64_t a) {
  std::vector<int64_t> out(1, 0);
  for (int64_t g = 0; g < in.groups(); ++g) {
    out.push_back(out.back() + round_up(in.uniform > 0 ? in.uniform : in.sizes[g], a));
  }
  return out;
}

void put_f32(std::vector<int>* bytes, int64_t index, float v) {
  uint8_t b[4];
  std::memcpy(b, &v, 4);
  for (int i = 0; i < 4; ++i) (*bytes)[index * 4 + i] = b[i];
}

struct ScaleRule {
  float multiplier, factor;
  uint32_t stored;  // FP32 bits or the scale byte
};

ScaleRule rule_for(const Recipe& recipe, float block_amax, float global_amax) {
  ScaleRule s{};
  if (has_f32_scales(recipe.scaling)) {
    s.multiplier = nm::fp8_scale_from_amax(block_amax, fp8_max_of(recipe.dtype), recipe.pow2);
    s.factor = nm::scale_inverse(s.multiplier);
    s.stored = nm::f32_to_bits(s.factor);
  } else if (recipe.scaling == SFMOE_SCALING_MX_1X32) {
    const uint8_t e = nm::mx_scale_from_amax(block_amax, fp8_max_of(recipe.dtype));
    s.multiplier = nm::mx_multiplier(e);
    s.factor = nm::e8m0_to_f32(e);
    s.stored = e;
  } else {
    const float global = nm::nvfp4_global_encode_scale(global_amax);
    const uint8_t sb = nm::nvfp4_block_scale(block_amax, global);
    s.multiplier = nm::nvfp4_block_multiplier(sb, global);
    s.factor = nm::mul_rn(nm::e4m3_to_f32(sb), nm::div_rn(1.0f, global));
    s.stored = sb;
  }
  return s;
}

Oracle make_oracle(const Input& in, const Quantized& q) {
  Oracle o;
  const Recipe& recipe = q.recipe;
  const int64_t C = q.cols, R = q.rows, G = q.groups, B = block_size(recipe.scaling);
  o.out_off = expected_out_off(in, q.alignment);
  o.end = o.out_off[G];
  o.x.assign(static_cast<size_t>(o.end * C), 0.0f);
  o.group_of_row.assign(static_cast<size_t>(o.end), 0);
  o.padding_row.assign(static_cast<size_t>(o.end), 1);
  o.group_amax.assign(static_cast<size_t>(G), 0.0f);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t n = in.uniform > 0 ? in.uniform : in.sizes[g];
    for (int64_t r = o.out_off[g]; r < o.out_off[g + 1]; ++r) {
      o.group_of_row[r] = g;
      const int64_t i = r - o.out_off[g];
      if (i >= n) continue;
      o.padding_row[r] = 0;
      for (int64_t c = 0; c < C; ++c) o.x[r * C + c] = in.at(in.begin(g) + i, c);
    }
    if (n > 0) o.group_amax[g] = amax_of(&in.values[in.begin(g) * C], n * C);
  }
  // The transformed columnwise blocks, and the group amax over them.
  auto column_block = [&](int64_t c, int64_t k, float* v) {
    for (int64_t j = 0; j < B; ++j) v[j] = o.x[(k * B + j) * C + c];
  };
  if (recipe.columnwise && recipe.transformed(1)) {
    o.columnwise_amax.assign(static_cast<size_t>(G), 0.0f);
    float v[16];
    for (int64_t k = 0; k * B < o.end; ++k) {
      const int64_t g = o.group_of_row[k * B];
      for (int64_t c = 0; c < C; ++c) {
        column_block(c, k, v);
        nm::hadamard16_transform(v);
        const float m = amax_of(v, 16);
        o.columnwise_amax[g] = std::isnan(o.columnwise_amax[g]) || std::isnan(m)
                                   ? std::nanf("")
                                   : std::max(o.columnwise_amax[g], m);
      }
    }
  }

  for (int copy = 0; copy < 2; ++copy) {
    if (!q.has(copy)) continue;
    Oracle::Copy& e = o.copy[copy];
    const size_t n = static_cast<size_t>(o.end * C);
    e.value.assign(n, 0.0f);
    e.multiplier.assign(n, 0.0f);
    e.factor.assign(n, 0.0f);
    e.finite.assign(n, 0);
    e.scale.assign(static_cast<size_t>(q.scale_bytes(copy)), -1);
    auto store = [&](int64_t index, uint32_t stored) {
      if (has_f32_scales(recipe.scaling)) {
        put_f32(&e.scale, index, nm::bits_to_f32(stored));
      } else {
        e.scale[index] = static_cast<int>(stored);
      }
    };
    auto record = [&](int64_t r, int64_t c, float value, const ScaleRule& s, bool finite) {
      e.value[r * C + c] = value;
      e.multiplier[r * C + c] = s.multiplier;
      e.factor[r * C + c] = s.factor;
      e.finite[r * C + c] = finite;
    };
    auto global_amax = [&](int64_t g) {
      return recipe.transformed(copy) ? o.columnwise_amax[g] : o.group_amax[g];
    };

    if (recipe.scaling == SFMOE_SCALING_TENSOR) {
      for (int64_t g = 0; g < G; ++g) {
        store(g, rule_for(recipe, o.group_amax[g], 0.0f).stored);  // every group, empty or not
      }
      for (int64_t r = 0; r < o.end; ++r) {
        const int64_t g = o.group_of_row[r];
        const ScaleRule s = rule_for(recipe, o.group_amax[g], 0.0f);
        for (int64_t c = 0; c < C; ++c) {
          record(r, c, o.x[r * C + c], s, std::isfinite(o.group_amax[g]));
        }
      }
    } else if (is_2d(recipe.scaling)) {
      std::vector<float> v(static_cast<size_t>(B * B));
      for (int64_t br = 0; br * B < o.end; ++br) {
        const int64_t g = o.group_of_row[br * B];
        for (int64_t bc = 0; bc < C / B; ++bc) {
          for (int64_t i = 0; i < B; ++i) {
            for (int64_t j = 0; j < B; ++j) v[i * B + j] = o.x[(br * B + i) * C + bc * B + j];
          }
          const float amax = amax_of(v.data(), B * B);
          const ScaleRule s = rule_for(recipe, amax, o.group_amax[g]);
          const bool finite =
              std::isfinite(amax) && (!is_nvfp4(recipe.scaling) || std::isfinite(o.group_amax[g]));
          // Rowwise [R/B, C/B] at (r/B, c/B); columnwise [C/B, R/B] at (c/B, r/B).
          store(copy == 0 ? br * (C / B) + bc : bc * (R / B) + br, s.stored);
          for (int64_t i = 0; i < B; ++i) {
            for (int64_t j = 0; j < B; ++j) {
              record(br * B + i, bc * B + j, v[i * B + j], s, finite);
            }
          }
        }
      }
    } else {
      const int64_t scale_cols = q.scale_cols(copy);
      auto where = [&](int64_t row, int64_t k) {
        return recipe.swizzled() ? nm::swizzled_scale_offset(row, k, scale_cols)
                                 : row * scale_cols + k;
      };
      std::vector<float> v(static_cast<size_t>(B));
      std::vector<int64_t> rr(static_cast<size_t>(B)), cc(static_cast<size_t>(B));
      const int64_t copy_rows = q.copy_rows(copy);
      for (int64_t m = 0; m < copy_rows; ++m) {
        for (int64_t k = 0; k < scale_cols; ++k) {
          // Rowwise block: row m, columns [kB, kB+B). Columnwise: column m, rows [kB, kB+B).
          const int64_t first_row = copy == 0 ? m : k * B;
          if (first_row >= o.end) continue;
          for (int64_t j = 0; j < B; ++j) {
            rr[j] = copy == 0 ? m : k * B + j;
            cc[j] = copy == 0 ? k * B + j : m;
            v[j] = o.x[rr[j] * C + cc[j]];
          }
          if (recipe.transformed(copy)) nm::hadamard16_transform(v.data());
          const int64_t g = o.group_of_row[first_row];
          const float amax = amax_of(v.data(), B);
          const ScaleRule s = rule_for(recipe, amax, global_amax(g));
          const bool finite =
              std::isfinite(amax) && (!is_nvfp4(recipe.scaling) || std::isfinite(global_amax(g)));
          store(where(m, k), s.stored);
          for (int64_t j = 0; j < B; ++j) record(rr[j], cc[j], v[j], s, finite);
        }
      }
      if (recipe.swizzled()) {
        // Padding entries beside written blocks are 0: rowwise, the padding columns of rows
        // below out_off[G]; columnwise, the padding rows under written row blocks.
        const int64_t padded_rows = round_up(copy_rows, 128), padded_cols = round_up(scale_cols, 4);
        for (int64_t i = 0; i < padded_rows; ++i) {
          for (int64_t k = 0; k < padded_cols; ++k) {
            if (i < copy_rows && k < scale_cols) continue;
            if ((copy == 0 ? i : k * B) >= o.end) continue;
            e.scale[nm::swizzled_scale_offset(i, k, scale_cols)] = 0;
          }
        }
      }
    }
  }
  return o;
}

// ---- error bounds -------------------------------------------------------------------------------

struct CodeFormat {
  double max, min_normal, subnormal_step;
  int mantissa_bits;
};
CodeFormat code_format(sfmoe_dtype dtype) {
  switch (dtype) {
    case SFMOE_DTYPE_FP8_E4M3:
      return {448.0, std::ldexp(1.0, -6), std::ldexp(1.0, -9), 3};
    case SFMOE_DTYPE_FP8_E5M2:
      return {57344.0, std::ldexp(1.0, -14), std::ldexp(1.0, -16), 2};
    default:  // E2M1
      return {6.0, 1.0, 0.5, 1};
  }
}

// |decoded - v| for value v encoded as code(v * multiplier) and decoded as code * factor:
// the element format's rounding error at the scaled value (half a step with round-to-nearest,
// a whole step with stochastic rounding; saturation above the largest code), times the decode
// factor, plus the error of the scale pair itself (multiplier * factor != 1) and of the final
// FP32 product.
double element_bound(sfmoe_dtype dtype, float v, float multiplier, float factor, bool stochastic) {
  const CodeFormat f = code_format(dtype);
  const float y = nm::mul_rn(v, multiplier);
  const double ay = std::fabs(static_cast<double>(y));
  const double tiny = std::ldexp(1.0, -147);
  if (factor == 0.0f) return std::fabs(v) + tiny;  // the block decodes to zeros
  if (!(ay < f.max)) {                             // saturated to +-max (y may be Inf)
    return std::fabs(f.max * factor - std::fabs(v)) + f.max * factor * std::ldexp(1.0, -23) + tiny;
  }
  const double step =
      ay < f.min_normal ? f.subnormal_step : std::ldexp(1.0, std::ilogb(ay) - f.mantissa_bits);
  const double code_error = (stochastic ? step : step / 2) * factor;
  const double scale_error = std::fabs(static_cast<double>(y) * factor - v);
  return code_error + scale_error + (std::fabs(v) + code_error) * std::ldexp(1.0, -22) + tiny;
}

// ---- checks -------------------------------------------------------------------------------------

// Collects mismatches and reports the first few (a broken rule would otherwise print millions).
class Failures {
 public:
  explicit Failures(std::string context) : context_(std::move(context)) {}
  ~Failures() {
    EXPECT_EQ(count_, 0) << context_ << ": " << count_ << " mismatches; first:\n" << first_.str();
  }
  void check(bool ok, const std::string& what) {
    expect(ok, [&] { return what; });
  }
  // `describe` builds the message, only for a mismatch (the checks run per element).
  template <class Describe>
  void expect(bool ok, Describe&& describe) {
    if (ok) return;
    if (count_++ < 6) first_ << "  " << describe() << "\n";
  }

 private:
  std::string context_;
  std::ostringstream first_;
  int64_t count_ = 0;
};

std::string at(const char* what, int64_t r, int64_t c) {
  std::ostringstream s;
  s << what << " (" << r << ", " << c << ")";
  return s.str();
}

bool poisoned(const std::vector<uint8_t>& v, int64_t from, int64_t to) {
  for (int64_t i = from; i < to; ++i) {
    if (v[i] != kPoison) return false;
  }
  return true;
}

void check_amax_value(Failures* f, float got, float want, const char* what, int64_t g) {
  const bool ok = std::isnan(want) ? std::isnan(got) : got == want;
  std::ostringstream s;
  s << what << "[" << g << "] = " << got << ", expected " << want;
  f->check(ok, s.str());
}

// |decoded - x| <= bound; where the bound reaches past the FP32 range the decoded product may
// overflow to Inf of x's sign (FP32 decode of a code rounded up at the top of the range).
bool within(float decoded, float x, double bound) {
  if (std::isinf(decoded) && std::signbit(decoded) == std::signbit(x)) {
    return std::fabs(static_cast<double>(x)) + bound >= nm::f32_max();
  }
  return std::fabs(static_cast<double>(decoded) - x) <= bound;
}

// Everything the specification fixes about a quantized tensor, and the round trip of each copy.
void check_quantized(const Input& in, Quantized& q, const Oracle& o) {
  const Recipe& recipe = q.recipe;
  const int64_t C = q.cols, R = q.rows, G = q.groups;
  const int bits = sfmoe_dtype_bits(recipe.dtype);
  Failures f(recipe.name() + " a=" + std::to_string(q.alignment) + " R=" + std::to_string(R));

  // Offsets: out_off, or untouched with uniform groups; nothing past num_groups + 1.
  for (int64_t g = 0; g <= G; ++g) {
    f.check(q.offsets[g] == (q.uniform > 0 ? poisoned_i64() : o.out_off[g]),
            "out_off[" + std::to_string(g) + "] = " + std::to_string(q.offsets[g]));
  }
  for (size_t i = static_cast<size_t>(G + 1); i < q.offsets.size(); ++i) {
    f.check(q.offsets[i] == poisoned_i64(), "offsets written past num_groups + 1");
  }

  // amax (TENSOR, NVFP4) and columnwise_amax (NVFP4 with the transform and a columnwise copy).
  const bool writes_amax = recipe.scaling == SFMOE_SCALING_TENSOR || is_nvfp4(recipe.scaling);
  for (int64_t g = 0; g < G; ++g) {
    if (writes_amax) check_amax_value(&f, f32_at(q.amax, g), o.group_amax[g], "amax", g);
    if (recipe.columnwise && recipe.transformed(1)) {
      check_amax_value(&f, f32_at(q.columnwise_amax, g), o.columnwise_amax[g], "columnwise_amax",
                       g);
    }
  }
  f.check(poisoned(q.amax, writes_amax ? G * 4 : 0, static_cast<int64_t>(q.amax.size())),
          "amax written where it must not be");
  f.check(poisoned(q.columnwise_amax, recipe.columnwise && recipe.transformed(1) ? G * 4 : 0,
                   static_cast<int64_t>(q.columnwise_amax.size())),
          "columnwise_amax written where it must not be");

  for (int copy = 0; copy < 2; ++copy) {
    if (!q.has(copy)) continue;
    const Oracle::Copy& e = o.copy[copy];
    const char* name = copy == 0 ? "rowwise" : "columnwise";
    // Scales: every byte as expected, the rest (and the slack) untouched.
    const std::vector<uint8_t>& scales = q.scales[copy];
    for (size_t i = 0; i < scales.size(); ++i) {
      const int want = i < e.scale.size() ? e.scale[i] : -1;
      f.expect(want < 0 ? scales[i] == kPoison : scales[i] == want, [&] {
        std::ostringstream s;
        s << name << " scale byte " << i << " = " << int(scales[i]) << ", expected "
          << (want < 0 ? std::string("untouched") : std::to_string(want));
        return s.str();
      });
    }
    // Data: rows at and beyond out_off[G] untouched.
    const std::vector<uint8_t>& data = q.data[copy];
    if (copy == 0) {
      f.check(poisoned(data, o.end * C * bits / 8, static_cast<int64_t>(data.size())),
              "rowwise data written at or beyond out_off[G]");
    } else {
      for (int64_t c = 0; c < C; ++c) {
        f.check(poisoned(data, (c * R + o.end) * bits / 8, (c + 1) * R * bits / 8),
                at("columnwise data written at or beyond out_off[G], column", c, 0));
      }
      f.check(poisoned(data, q.data_bytes(), static_cast<int64_t>(data.size())),
              "columnwise data written past its end");
    }
    // Padding rows are quantized zeros (the transform mixes them with data rows).
    if (!recipe.transformed(copy)) {
      for (int64_t r = 0; r < o.end; ++r) {
        if (!o.padding_row[r]) continue;
        for (int64_t c = 0; c < C; ++c) {
          if (!e.finite[r * C + c]) continue;
          const int64_t index = copy == 0 ? r * C + c : c * R + r;
          f.expect(code_at(data, recipe.dtype, index) == 0,
                   [&] { return at("padding code", r, c); });
        }
      }
    }

    // Round trip: dequantize this copy and compare with the input within the format's bound.
    const std::vector<uint8_t> out = dequantize(q, in, copy);
    f.check(poisoned(out, o.end * C * 4, static_cast<int64_t>(out.size())),
            std::string(name) + " dequantize wrote at or beyond out_off[G]");
    const bool stochastic = recipe.stochastic && is_nvfp4(recipe.scaling);
    if (!recipe.transformed(copy)) {
      for (int64_t r = 0; r < o.end; ++r) {
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = r * C + c;
          if (!e.finite[i]) continue;
          const float d = f32_at(out, i);
          if (o.padding_row[r]) {
            f.expect(nm::f32_to_bits(d) == 0,
                     [&] { return at("padding row decodes to non-zero", r, c); });
            continue;
          }
          const double bound =
              element_bound(recipe.dtype, e.value[i], e.multiplier[i], e.factor[i], stochastic);
          const double error = std::fabs(static_cast<double>(d) - o.x[i]);
          f.expect(within(d, o.x[i], bound), [&] {
            std::ostringstream s;
            s << name << " (" << r << ", " << c << "): x=" << o.x[i] << " decoded " << d
              << " error " << error << " > bound " << bound;
            return s.str();
          });
        }
      }
    } else {
      // The Hadamard copy: the decoded block is H^-1 (t + err) with t the transformed block and
      // |err_j| <= b_j; H^-1 is orthonormal, so each element is off by at most ||b||_2, plus the
      // FP32 rounding of the two transforms.
      for (int64_t k = 0; k * 16 < o.end; ++k) {
        for (int64_t c = 0; c < C; ++c) {
          bool finite = true;
          double sum_sq = 0.0, max_x = 0.0, max_t = 0.0;
          for (int64_t j = 0; j < 16; ++j) {
            const int64_t i = (k * 16 + j) * C + c;
            finite = finite && e.finite[i];
            const double b =
                element_bound(recipe.dtype, e.value[i], e.multiplier[i], e.factor[i], stochastic);
            sum_sq += b * b;
            max_x = std::max(max_x, std::fabs(static_cast<double>(o.x[i])));
            max_t = std::max(max_t, std::fabs(static_cast<double>(e.value[i])));
          }
          // The butterflies add up to 16 magnitudes in FP32: blocks near the top of the range
          // overflow in the transforms themselves, which no scale can help.
          if (!finite || 16 * std::max(max_x, max_t) >= nm::f32_max()) continue;
          const double bound =
              std::sqrt(sum_sq) + (max_x + max_t) * std::ldexp(1.0, -17) + std::ldexp(1.0, -140);
          for (int64_t j = 0; j < 16; ++j) {
            const int64_t i = (k * 16 + j) * C + c;
            const double error = std::fabs(static_cast<double>(f32_at(out, i)) - o.x[i]);
            f.expect(within(f32_at(out, i), o.x[i], bound), [&] {
              std::ostringstream s;
              s << "hadamard (" << k * 16 + j << ", " << c << "): x=" << o.x[i] << " decoded "
                << f32_at(out, i) << " error " << error << " > bound " << bound;
              return s.str();
            });
          }
        }
      }
    }
  }
}

// Every recipe with the variants that change its numerics or its layout.
std::vector<Recipe> all_recipes() {
  std::vector<Recipe> recipes;
  for (sfmoe_dtype dtype : {SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_FP8_E5M2}) {
    for (sfmoe_scaling s :
         {SFMOE_SCALING_TENSOR, SFMOE_SCALING_BLOCK_1X128, SFMOE_SCALING_BLOCK_128X128}) {
      for (bool pow2 : {false, true}) {
        Recipe r;
        r.scaling = s;
        r.dtype = dtype;
        r.pow2 = pow2;
        recipes.push_back(r);
      }
    }
    for (sfmoe_scale_layout layout : {SFMOE_SCALE_LAYOUT_COMPACT, SFMOE_SCALE_LAYOUT_SWIZZLED}) {
      Recipe r;
      r.scaling = SFMOE_SCALING_MX_1X32;
      r.dtype = dtype;
      r.layout = layout;
      recipes.push_back(r);
    }
  }
  for (sfmoe_scale_layout layout : {SFMOE_SCALE_LAYOUT_COMPACT, SFMOE_SCALE_LAYOUT_SWIZZLED}) {
    for (bool hadamard : {false, true}) {
      for (bool sr : {false, true}) {
        Recipe r;
        r.scaling = SFMOE_SCALING_NV_1X16;
        r.dtype = SFMOE_DTYPE_FP4_E2M1;
        r.layout = layout;
        r.hadamard = hadamard;
        r.stochastic = sr;
        recipes.push_back(r);
      }
    }
  }
  for (bool sr : {false, true}) {
    Recipe r;
    r.scaling = SFMOE_SCALING_NV_16X16;
    r.dtype = SFMOE_DTYPE_FP4_E2M1;
    r.stochastic = sr;
    recipes.push_back(r);
  }
  return recipes;
}

// Columns for a recipe: several blocks along the row, not a multiple of 4 scale columns where the
// swizzle pads, and not equal to the row count (a transposed index would go unnoticed).
int64_t cols_for(const Recipe& r) {
  switch (block_size(r.scaling)) {
    case 128:
      return 384;
    case 32:
      return 160;
    case 16:
      return 80;
    default:
      return 72;
  }
}

const sfmoe_dtype kInputDtypes[] = {SFMOE_DTYPE_BF16, SFMOE_DTYPE_FP32, SFMOE_DTYPE_FP16};

// ---- tests
// ---------------------------------------------------------------------------------------

TEST(CpuQuantize, RoundTripEveryRecipeAndCopyWithinTheFormatBound) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x51u);
  const std::vector<int64_t> sizes = {1, 31, 0, 33, 993, 0, 17, 64};
  int run = 0;
  for (const Recipe& base : all_recipes()) {
    for (int copies = 0; copies < 3; ++copies) {
      Recipe recipe = base;
      recipe.rowwise = copies != 1;
      recipe.columnwise = copies != 0;
      const sfmoe_dtype in_dtype = kInputDtypes[run++ % 3];
      ValueMix mix;
      mix.nonfinite_group = 3;  // the group of 33 rows
      mix.extreme_group = 6;    // the group of 17 rows
      const Input in = make_input(rng, in_dtype, sizes, cols_for(recipe), false, mix);
      // The minimum alignment, or a random larger power of two.
      const int64_t a = min_alignment(recipe) << (rng() % 3);
      const int64_t extra_rows = static_cast<int64_t>(rng() % 3) * row_block(recipe) + rng() % 2;
      Quantized q =
          quantize(in, recipe, a, extra_rows, make_config(recipe, rng(), rng() % 1000, false));
      SCOPED_TRACE(recipe.name() + " input " + sfmoe_dtype_name(in_dtype));
      check_quantized(in, q, make_oracle(in, q));
    }
  }
}

TEST(CpuQuantize, UniformGroups) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x52u);
  for (const Recipe& recipe : all_recipes()) {
    const int64_t a = std::max<int64_t>(min_alignment(recipe), 16);
    const int64_t u = a * (1 + static_cast<int64_t>(rng() % 3));
    const Input in =
        make_input(rng, SFMOE_DTYPE_BF16, std::vector<int64_t>(3, u), cols_for(recipe), true);
    Quantized q = quantize(in, recipe, a, 0, make_config(recipe, rng(), 7, false));
    SCOPED_TRACE(recipe.name() + " uniform rows " + std::to_string(u));
    check_quantized(in, q, make_oracle(in, q));
  }
}

TEST(CpuQuantize, OutputOffsetsForRandomSizesAndAlignments) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x53u);
  Recipe recipes[2];
  recipes[0].scaling = SFMOE_SCALING_TENSOR;
  recipes[1].scaling = SFMOE_SCALING_MX_1X32;
  recipes[1].columnwise = false;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t groups = static_cast<int64_t>(rng() % 13);
    std::vector<int64_t> sizes(static_cast<size_t>(groups));
    for (auto& n : sizes) n = rng() % 3 == 0 ? 0 : static_cast<int64_t>(rng() % 300);
    const int64_t a = int64_t{1} << (rng() % 9);
    const Recipe& recipe = recipes[trial % 2];
    ValueMix mix;
    mix.constants = false;
    const Input in = make_input(rng, SFMOE_DTYPE_BF16, sizes, 64, false, mix);
    Quantized q = quantize(in, recipe, a, 0, make_config(recipe, 0, 0, false));
    SCOPED_TRACE("trial " + std::to_string(trial) + " a=" + std::to_string(a));
    check_quantized(in, q, make_oracle(in, q));
  }
}

// 2D blocks: the rowwise scales are written without the rowwise codes (the FP8 128x128 dgrad reads
// the columnwise codes with them), the same bytes as with the codes; the columnwise copy is
// unchanged.
TEST(CpuQuantize, TwoDimensionalRowwiseScalesWithoutRowwiseCodes) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x5Cu);
  for (const Recipe& recipe : all_recipes()) {
    if (!is_2d(recipe.scaling) || !recipe.rowwise || !recipe.columnwise) continue;
    const int64_t a = std::max<int64_t>(min_alignment(recipe), 16);
    const int64_t u = a * (1 + static_cast<int64_t>(rng() % 3));
    const Input in =
        make_input(rng, SFMOE_DTYPE_BF16, std::vector<int64_t>(3, u), cols_for(recipe), true);
    const sfmoe_quantize_config config = make_config(recipe, rng(), 7, false);
    Quantized both = quantize(in, recipe, a, 0, config);
    Quantized scales_only = both;
    for (int copy = 0; copy < 2; ++copy) {
      std::fill(scales_only.data[copy].begin(), scales_only.data[copy].end(), kPoison);
      std::fill(scales_only.scales[copy].begin(), scales_only.scales[copy].end(), kPoison);
    }
    GroupedQuantizeArgs args = scales_only.args(in, nullptr);
    args.rowwise = nullptr;
    sfmoe::cpu::grouped_quantize(args);
    SCOPED_TRACE(recipe.name() + " uniform rows " + std::to_string(u));
    EXPECT_TRUE(std::all_of(scales_only.data[0].begin(), scales_only.data[0].end(), [](uint8_t v) {
      return v == kPoison;
    })) << "rowwise codes written";
    EXPECT_EQ(scales_only.scales[0], both.scales[0]) << "rowwise scales";
    EXPECT_EQ(scales_only.data[1], both.data[1]) << "columnwise codes";
    EXPECT_EQ(scales_only.scales[1], both.scales[1]) << "columnwise scales";
  }
}

// Plants one large value in one block at a time and requires exactly that block's scale entry
// (both copies' entries for 2D blocks) to change: a transposed or shifted scale index fails.
TEST(CpuQuantize, PlantedValueChangesOnlyItsBlockScale) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x54u);
  std::vector<Recipe> recipes;
  for (const Recipe& r : all_recipes()) {
    if (r.pow2 || r.stochastic || r.hadamard || r.dtype == SFMOE_DTYPE_FP8_E5M2) continue;
    for (int copies = 0; copies < (is_2d(r.scaling) ? 1 : 2); ++copies) {
      Recipe one = r;
      one.rowwise = is_2d(r.scaling) || copies == 0;
      one.columnwise = is_2d(r.scaling) || copies == 1;
      recipes.push_back(one);
    }
  }
  for (const Recipe& recipe : recipes) {
    const int64_t B = std::max<int64_t>(block_size(recipe.scaling), 1);
    const int64_t a = std::max<int64_t>({min_alignment(recipe), B, 16});
    // Two groups, the second one partly padded; 3 blocks along a row, 5 row blocks (R != C).
    const std::vector<int64_t> sizes = {2 * a, 3 * a - 3};
    const int64_t cols = 3 * (block_size(recipe.scaling) > 0 ? B : 16);
    ValueMix mix;
    mix.constants = false;
    Input in = make_input(rng, SFMOE_DTYPE_FP32, sizes, cols, false, mix);
    const int64_t total = in.offsets.back();
    for (int64_t r = 0; r < total; ++r) {
      for (int64_t c = 0; c < cols; ++c) in.set(r, c, 1.0f);
    }
    // NVFP4: an anchor per group keeps the group amax (so the global scale) fixed.
    const float anchor = 4096.0f, planted = 8.0f;
    if (is_nvfp4(recipe.scaling)) {
      for (int64_t g = 0; g < 2; ++g) in.set(in.offsets[g], 0, anchor);
    }
    const sfmoe_quantize_config config = make_config(recipe, 0, 0, false);
    const Quantized base = quantize(in, recipe, a, 0, config);
    const Oracle o = make_oracle(in, base);
    SCOPED_TRACE(recipe.name());
    Failures f(recipe.name() + " planted");
    for (int trial = 0; trial < 24; ++trial) {
      // A data row and column; skip the anchors' blocks.
      const int64_t g = static_cast<int64_t>(rng() % 2);
      const int64_t r_in = in.offsets[g] + static_cast<int64_t>(rng() % sizes[g]);
      const int64_t c = static_cast<int64_t>(rng() % cols);
      const int64_t r = o.out_off[g] + (r_in - in.offsets[g]);  // output row
      if (is_nvfp4(recipe.scaling) && r / B == o.out_off[g] / B && c / B == 0) continue;
      Input planted_in = in;
      planted_in.set(r_in, c, planted);
      const Quantized q = quantize(planted_in, recipe, a, 0, config);
      // The entries expected to change, as byte offsets of each copy's scale buffer.
      std::vector<int64_t> expected[2];
      const int64_t entry = has_f32_scales(recipe.scaling) ? 4 : 1;
      for (int copy = 0; copy < 2; ++copy) {
        if (q.has(copy)) expected[copy].push_back(scale_entry(q, copy, r, c, g) * entry);
      }
      for (int copy = 0; copy < 2; ++copy) {
        if (!q.has(copy)) continue;
        std::vector<int64_t> changed;
        for (int64_t i = 0; i < q.scale_bytes(copy); i += entry) {
          if (std::memcmp(&q.scales[copy][i], &base.scales[copy][i], entry) != 0) {
            changed.push_back(i);
          }
        }
        std::ostringstream s;
        s << (copy ? "columnwise" : "rowwise") << " planted at (" << r << ", " << c
          << "): changed entries";
        for (int64_t i : changed) s << " " << i / entry;
        s << ", expected " << expected[copy][0] / entry;
        f.check(changed == expected[copy], s.str());
        // And the new entry is the rule for the planted amax.
        if (changed == expected[copy]) {
          const ScaleRule rule = rule_for(recipe, planted, anchor);
          uint32_t got = 0;
          std::memcpy(&got, &q.scales[copy][expected[copy][0]], entry);
          f.check(got == rule.stored, s.str() + " has the wrong value");
        }
      }
    }
  }
}

TEST(CpuQuantize, TensorScaleIsTheRuleOfTheGroupAmax) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x55u);
  for (sfmoe_dtype dtype : {SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_FP8_E5M2}) {
    for (bool pow2 : {false, true}) {
      Recipe recipe;
      recipe.dtype = dtype;
      recipe.pow2 = pow2;
      const Input in = make_input(rng, SFMOE_DTYPE_BF16, {5, 0, 40, 1}, 24, false);
      Quantized q = quantize(in, recipe, 1, 3, make_config(recipe, 0, 0, false));
      for (int64_t g = 0; g < 4; ++g) {
        const float amax =
            in.sizes[g] ? amax_of(&in.values[in.offsets[g] * 24], in.sizes[g] * 24) : 0.0f;
        EXPECT_EQ(f32_at(q.amax, g), amax) << g;
        const float want =
            nm::scale_inverse(nm::fp8_scale_from_amax(amax, fp8_max_of(dtype), pow2));
        EXPECT_EQ(f32_at(q.scales[0], g), want) << g;
        EXPECT_EQ(f32_at(q.scales[1], g), want) << g;
        if (pow2) {  // a power of two: the scaling is exact
          int e;
          EXPECT_EQ(std::frexp(want, &e), 0.5f) << g;
        }
      }
      EXPECT_EQ(f32_at(q.scales[0], 1), 1.0f) << "an empty group has amax 0 and scale 1";
    }
  }
}

// Delayed scaling: with config.tensor_scales each group is encoded with its given scale (as is:
// power_of_two_scales does not apply), scale_inv is that scale's inverse, and the amax is still
// the group's. Given scales with any other scaling are refused.
TEST(CpuQuantize, GivenTensorScalesAreUsedAsIs) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x56u);
  for (sfmoe_dtype dtype : {SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_FP8_E5M2}) {
    Recipe recipe;
    recipe.dtype = dtype;
    recipe.pow2 = true;  // ignored with given scales
    const Input in = make_input(rng, SFMOE_DTYPE_BF16, {5, 0, 40, 1}, 24, false);
    const std::vector<float> given = {3.0f, 0.75f, 1e6f, 1e-3f};  // the third saturates
    sfmoe_quantize_config config = make_config(recipe, 0, 0, false);
    config.tensor_scales = given.data();
    Quantized q = quantize(in, recipe, 1, 3, config);
    for (int64_t g = 0; g < 4; ++g) {
      const float amax =
          in.sizes[g] ? amax_of(&in.values[in.offsets[g] * 24], in.sizes[g] * 24) : 0.0f;
      EXPECT_EQ(f32_at(q.amax, g), amax) << g;
      EXPECT_EQ(f32_at(q.scales[0], g), nm::scale_inverse(given[g])) << g;
      EXPECT_EQ(f32_at(q.scales[1], g), nm::scale_inverse(given[g])) << g;
      const int64_t out_row = q.offsets[g];
      for (int64_t r = 0; r < in.sizes[g]; ++r) {
        for (int64_t c = 0; c < 24; ++c) {
          const float x = in.values[(in.offsets[g] + r) * 24 + c];
          const float scaled = nm::mul_rn(x, given[g]);
          const uint8_t want =
              dtype == SFMOE_DTYPE_FP8_E4M3 ? nm::f32_to_e4m3(scaled) : nm::f32_to_e5m2(scaled);
          ASSERT_EQ(q.data[0][(out_row + r) * 24 + c], want) << g << " " << r << " " << c;
        }
      }
    }
  }
}

// A given group amax (config.group_amax) is the amax: equal to the computed one, every byte is
// as without it; otherwise the scales follow the rule from the given value, the output amax is
// the given one, and values beyond it saturate.
TEST(CpuQuantize, GivenGroupAmaxIsUsedAsTheAmax) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x57u);
  const std::vector<int64_t> sizes = {5, 0, 40, 1, 19};
  const int64_t cols = 32;
  Recipe fp8, nv1, nv2;
  nv1.scaling = SFMOE_SCALING_NV_1X16;
  nv1.dtype = SFMOE_DTYPE_FP4_E2M1;
  nv2 = nv1;
  nv2.scaling = SFMOE_SCALING_NV_16X16;
  Recipe fp8_pow2 = fp8;
  fp8_pow2.pow2 = true;
  fp8_pow2.dtype = SFMOE_DTYPE_FP8_E5M2;
  for (const Recipe& recipe : {fp8, fp8_pow2, nv1, nv2}) {
    const Input in = make_input(rng, SFMOE_DTYPE_BF16, sizes, cols, false);
    const int64_t a = recipe.scaling == SFMOE_SCALING_TENSOR ? 1 : 16;  // NVFP4: 16-row blocks
    const sfmoe_quantize_config plain = make_config(recipe, 0, 0, false);
    const Quantized computed = quantize(in, recipe, a, 3, plain);
    std::vector<float> amax(sizes.size());
    for (size_t g = 0; g < sizes.size(); ++g) amax[g] = f32_at(computed.amax, g);
    sfmoe_quantize_config config = plain;
    config.group_amax = amax.data();
    const Quantized given = quantize(in, recipe, a, 3, config);
    for (int copy = 0; copy < 2; ++copy) {
      EXPECT_EQ(given.data[copy], computed.data[copy]) << copy;
      EXPECT_EQ(given.scales[copy], computed.scales[copy]) << copy;
    }
    EXPECT_EQ(given.amax, computed.amax);
  }
  // FP8 per-tensor with other amaxes: twice the real one, a thousandth of it (saturation), 0 for
  // a non-empty group, Inf; the empty group's given amax is copied too.
  for (const Recipe& recipe : {fp8, fp8_pow2}) {
    const Input in = make_input(rng, SFMOE_DTYPE_BF16, sizes, cols, false);
    std::vector<float> amax(sizes.size());
    for (size_t g = 0; g < sizes.size(); ++g) {
      const float real =
          sizes[g] ? amax_of(&in.values[in.offsets[g] * cols], sizes[g] * cols) : 0.0f;
      amax[g] = g == 0   ? 2.0f * real
                : g == 1 ? 5.0f
                : g == 2 ? real / 1000.0f
                : g == 3 ? 0.0f
                         : INFINITY;
    }
    sfmoe_quantize_config config = make_config(recipe, 0, 0, false);
    config.group_amax = amax.data();
    const Quantized q = quantize(in, recipe, 1, 3, config);
    const float max = fp8_max_of(recipe.dtype);
    int saturated = 0;
    for (size_t g = 0; g < sizes.size(); ++g) {
      EXPECT_EQ(f32_at(q.amax, g), amax[g]) << g;
      const float scale = nm::fp8_scale_from_amax(amax[g], max, recipe.pow2);
      EXPECT_EQ(f32_at(q.scales[0], g), nm::scale_inverse(scale)) << g;
      for (int64_t r = 0; r < sizes[g]; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const float scaled = nm::mul_rn(in.values[(in.offsets[g] + r) * cols + c], scale);
          const uint8_t want = recipe.dtype == SFMOE_DTYPE_FP8_E4M3 ? nm::f32_to_e4m3(scaled)
                                                                    : nm::f32_to_e5m2(scaled);
          ASSERT_EQ(q.data[0][(q.offsets[g] + r) * cols + c], want) << g << " " << r << " " << c;
          saturated += std::fabs(scaled) > max && std::isfinite(scaled);
        }
      }
    }
    EXPECT_GT(saturated, 0) << "the thousandth amax saturates values";
  }
  // NVFP4 with an amax far below the values (1/1024; rows of magnitude about 1): block scales
  // saturate at E4M3's 448 and the codes of values at least that amax at 6 (magnitude code 7).
  {
    ValueMix narrow;
    narrow.exponent_range = 1;
    const Input in = make_input(rng, SFMOE_DTYPE_BF16, {48}, cols, false, narrow);
    const std::vector<float> amax = {1.0f / 1024.0f};
    Recipe recipe = nv1;
    recipe.columnwise = false;
    sfmoe_quantize_config config = make_config(recipe, 0, 0, false);
    config.group_amax = amax.data();
    const Quantized q = quantize(in, recipe, 1, 0, config);
    EXPECT_EQ(f32_at(q.amax, 0), amax[0]);
    int checked = 0;
    for (int64_t r = 0; r < 48; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float x = in.values[r * cols + c];
        if (!(std::fabs(x) >= amax[0])) continue;
        const int64_t i = r * cols + c;
        const uint8_t code = (q.data[0][i / 2] >> (4 * (i % 2))) & 0xF;
        ASSERT_EQ(code & 0x7, 0x7) << r << " " << c << " " << x;
        ++checked;
      }
    }
    EXPECT_GT(checked, 48 * cols / 2) << "values at or above the given amax";
  }
}

TEST(CpuQuantize, StochasticRoundingIsReproducibleAndFollowsTheStream) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x56u);
  for (sfmoe_scaling scaling : {SFMOE_SCALING_NV_1X16, SFMOE_SCALING_NV_16X16}) {
    for (bool hadamard : {false, true}) {
      if (hadamard && scaling == SFMOE_SCALING_NV_16X16) continue;
      Recipe recipe;
      recipe.scaling = scaling;
      recipe.dtype = SFMOE_DTYPE_FP4_E2M1;
      recipe.stochastic = true;
      recipe.hadamard = hadamard;
      ValueMix mix;
      mix.exponent_range = 2;
      const Input in = make_input(rng, SFMOE_DTYPE_BF16, {40, 0, 77, 301}, 48, false, mix);
      const uint64_t seed = rng(), offset = rng() % 100000;
      const Quantized q1 = quantize(in, recipe, 16, 16, make_config(recipe, seed, offset, false));
      const Quantized q2 = quantize(in, recipe, 16, 16, make_config(recipe, seed, offset, false));
      const Quantized q3 =
          quantize(in, recipe, 16, 16, make_config(recipe, seed, offset + 1, false));
      const Oracle o = make_oracle(in, q1);
      SCOPED_TRACE(recipe.name());
      for (int copy = 0; copy < 2; ++copy) {
        EXPECT_EQ(q1.data[copy], q2.data[copy]) << "same seed and offset, different codes";
        EXPECT_EQ(q1.scales[copy], q3.scales[copy]) << "scales do not depend on the stream";
        // Codes under another offset differ with probability 2p(1-p) where p is the fraction
        // of the scaled value between its two E2M1 neighbours.
        int64_t differ = 0;
        double expected_differ = 0.0;
        Failures f(recipe.name() + (copy ? " columnwise" : " rowwise") + " stream");
        for (int64_t r = 0; r < o.end; ++r) {
          for (int64_t c = 0; c < q1.cols; ++c) {
            const int64_t index = copy == 0 ? r * q1.cols + c : c * q1.rows + r;
            const uint32_t code = code_at(q1.data[copy], recipe.dtype, index);
            differ += code != code_at(q3.data[copy], recipe.dtype, index);
            // Element (r, c) draws element r*C + c of stream 2*offset (rowwise) and element
            // c*R + r of stream 2*offset + 1 (columnwise).
            const int64_t i = r * q1.cols + c;
            const uint32_t bits =
                nm::philox_random_bits(seed, 2 * offset + copy, static_cast<uint64_t>(index));
            const float y = nm::mul_rn(o.copy[copy].value[i], o.copy[copy].multiplier[i]);
            const uint32_t want = nm::f32_to_e2m1_stochastic(y, bits);
            f.expect(code == want, [&] { return at("stochastic code", r, c); });
            const double ay = std::fabs(static_cast<double>(y));
            if (ay < 6.0) {
              const double step = ay < 2 ? 0.5 : (ay < 4 ? 1.0 : 2.0);
              const double p = ay / step - std::floor(ay / step);
              expected_differ += 2 * p * (1 - p);
            }
          }
        }
        EXPECT_GT(expected_differ, 200.0) << "the input should exercise the rounding";
        EXPECT_GT(static_cast<double>(differ), expected_differ / 2)
            << "another offset should give other codes";
      }
    }
  }
}

// offset_device adds to the host offset when the quantization runs: offset a with b on the device
// gives the codes of offset a + b, and changing only the device value changes the codes.
TEST(CpuQuantize, StochasticRoundingOffsetOnTheDeviceAddsToTheHostOffset) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x57u);
  Recipe recipe;
  recipe.scaling = SFMOE_SCALING_NV_1X16;
  recipe.dtype = SFMOE_DTYPE_FP4_E2M1;
  recipe.stochastic = true;
  ValueMix mix;
  mix.exponent_range = 2;
  const Input in = make_input(rng, SFMOE_DTYPE_BF16, {40, 0, 77, 301}, 48, false, mix);
  const uint64_t seed = rng(), a = rng() % 100000, b = 1 + rng() % 1000;
  const Quantized sum = quantize(in, recipe, 16, 16, make_config(recipe, seed, a + b, false));
  uint64_t on_device = b;
  sfmoe_quantize_config split = make_config(recipe, seed, a, false);
  split.offset_device = &on_device;
  const Quantized added = quantize(in, recipe, 16, 16, split);
  on_device = b + 1;
  const Quantized next = quantize(in, recipe, 16, 16, split);
  for (int copy = 0; copy < 2; ++copy) {
    if (!sum.has(copy)) continue;
    EXPECT_EQ(added.data[copy], sum.data[copy]) << "copy " << copy;
    EXPECT_EQ(added.scales[copy], sum.scales[copy]) << "copy " << copy;
    EXPECT_NE(next.data[copy], sum.data[copy]) << "copy " << copy << ": the device value is read";
  }
}

// Values whose block amax is 6 in both directions (multiplier exactly 1): the mean of the
// stochastically rounded values must be the value, where round-to-nearest is visibly biased.
TEST(CpuQuantize, StochasticRoundingIsUnbiased) {
  const int64_t rows = 2048, cols = 64;
  const float targets[] = {0.1f, 0.3f, 0.7f, 1.1f, 1.37f, 1.9f, 2.2f, 2.75f,
                           3.4f, 4.5f, 5.1f, 5.9f, 0.05f, 2.5f, 3.0f};
  std::mt19937_64 rng(1);
  Input in = make_input(rng, SFMOE_DTYPE_FP32, {rows}, cols, false);
  auto target_of = [&](int64_t r, int64_t c) -> int {
    return r % 16 == c % 16 ? -1 : static_cast<int>((r * 7 + c * 3) % 15);
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int t = target_of(r, c);
      in.set(r, c, t < 0 ? 6.0f : ((r + c) % 2 ? -targets[t] : targets[t]));
    }
  }
  for (bool sr : {true, false}) {
    Recipe recipe;
    recipe.scaling = SFMOE_SCALING_NV_1X16;
    recipe.dtype = SFMOE_DTYPE_FP4_E2M1;
    recipe.stochastic = sr;
    Quantized q = quantize(in, recipe, 16, 0,
                           make_config(recipe, sfmoe::testing::session_test_seed(), 3, false));
    for (int copy = 0; copy < 2; ++copy) {
      const std::vector<uint8_t> out = dequantize(q, in, copy);
      double sum[15] = {}, count[15] = {};
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int t = target_of(r, c);
          if (t < 0) continue;
          sum[t] += std::fabs(f32_at(out, r * cols + c));
          count[t] += 1;
        }
      }
      bool biased = false;
      for (int t = 0; t < 15; ++t) {
        const double x = targets[t], mean = sum[t] / count[t];
        const double step = x < 2 ? 0.5 : (x < 4 ? 1.0 : 2.0);
        const double lo = std::floor(x / step) * step, p = (x - lo) / step;
        const double sigma = step * std::sqrt(p * (1 - p) / count[t]);
        const bool close = std::fabs(mean - x) <= 5 * sigma + 1e-6;
        if (sr) {
          EXPECT_TRUE(close) << (copy ? "columnwise" : "rowwise") << " x=" << x << " mean " << mean
                             << " sigma " << sigma;
        }
        biased = biased || !close;
      }
      if (!sr) {
        EXPECT_TRUE(biased) << "round-to-nearest should fail this statistic";
      }
    }
  }
}

TEST(CpuQuantize, SwizzleAndUnswizzleRoundTrip) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x57u);
  const int64_t shapes[][2] = {{0, 3}, {1, 1}, {31, 3}, {128, 4}, {129, 5}, {257, 8}, {300, 9}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], scale_cols = shape[1];
    const int64_t padded = nm::swizzled_scale_padded_size(rows, scale_cols);
    EXPECT_EQ(padded, round_up(rows, 128) * round_up(scale_cols, 4));
    std::vector<uint8_t> compact(static_cast<size_t>(rows * scale_cols));
    for (auto& b : compact) b = static_cast<uint8_t>(rng() % 255 + 1);  // never 0 or the poison
    for (auto& b : compact) b = b == kPoison ? 1 : b;
    std::vector<uint8_t> swizzled(static_cast<size_t>(padded + kSlack), kPoison);
    sfmoe::cpu::swizzle_scales(compact.data(), rows, scale_cols, swizzled.data());
    std::vector<uint8_t> expected(static_cast<size_t>(padded), 0);  // padding entries are 0
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < scale_cols; ++k) {
        // Tile (r/128, k/4) of 512 bytes, row-major over tiles; inside, (r%32)*16 + (r%128/32)*4
        // + k%4 (docs/numerics.md).
        const int64_t tile = (r / 128) * (round_up(scale_cols, 4) / 4) + k / 4;
        expected[tile * 512 + (r % 32) * 16 + (r % 128 / 32) * 4 + k % 4] =
            compact[r * scale_cols + k];
      }
    }
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), swizzled.begin()))
        << rows << "x" << scale_cols;
    EXPECT_TRUE(poisoned(swizzled, padded, padded + kSlack)) << "wrote past the padded size";
    std::vector<uint8_t> back(static_cast<size_t>(rows * scale_cols + kSlack), kPoison);
    sfmoe::cpu::unswizzle_scales(swizzled.data(), rows, scale_cols, back.data());
    EXPECT_TRUE(std::equal(compact.begin(), compact.end(), back.begin()));
    EXPECT_TRUE(poisoned(back, rows * scale_cols, rows * scale_cols + kSlack));
  }
}

TEST(CpuQuantize, SwizzledScalesAreCompactScalesMoved) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x58u);
  for (sfmoe_scaling scaling : {SFMOE_SCALING_MX_1X32, SFMOE_SCALING_NV_1X16}) {
    Recipe compact;
    compact.scaling = scaling;
    compact.dtype = scaling == SFMOE_SCALING_MX_1X32 ? SFMOE_DTYPE_FP8_E4M3 : SFMOE_DTYPE_FP4_E2M1;
    Recipe swizzled = compact;
    swizzled.layout = SFMOE_SCALE_LAYOUT_SWIZZLED;
    const Input in = make_input(rng, SFMOE_DTYPE_BF16, {130, 0, 31, 200}, 224, false);
    const sfmoe_quantize_config config = make_config(compact, 0, 0, false);
    const Quantized a = quantize(in, compact, 32, 64, config);
    const Quantized b = quantize(in, swizzled, 32, 64, config);
    const int64_t end = expected_out_off(in, 32).back();
    for (int copy = 0; copy < 2; ++copy) {
      EXPECT_EQ(a.data[copy], b.data[copy]) << "the layout of the scales changed the data";
      const int64_t rows = a.copy_rows(copy), scale_cols = a.scale_cols(copy);
      const int64_t block = block_size(scaling);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t k = 0; k < scale_cols; ++k) {
          if ((copy == 0 ? i : k * block) >= end) continue;
          ASSERT_EQ(b.scales[copy][nm::swizzled_scale_offset(i, k, scale_cols)],
                    a.scales[copy][i * scale_cols + k])
              << sfmoe_scaling_name(scaling) << " copy " << copy << " (" << i << ", " << k << ")";
        }
      }
      // unswizzle_scales recovers the compact matrix (rows past out_off[G] hold poison in both).
      std::vector<uint8_t> back(static_cast<size_t>(rows * scale_cols), 0);
      sfmoe::cpu::unswizzle_scales(b.scales[copy].data(), rows, scale_cols, back.data());
      EXPECT_TRUE(std::equal(back.begin(), back.end(), a.scales[copy].begin()));
    }
  }
}

// docs/quantization.md, "NaN and Inf": codes and scales of blocks holding Inf or NaN.
TEST(CpuQuantize, NanAndInfFollowTheSpecification) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (const Recipe& recipe : all_recipes()) {
    if (recipe.stochastic || recipe.pow2 || recipe.swizzled()) continue;
    for (bool with_nan : {false, true}) {
      const int64_t B = std::max<int64_t>(block_size(recipe.scaling), 16);
      const int64_t cols = 2 * B;
      std::mt19937_64 rng(1);
      ValueMix mix;
      mix.constants = false;
      Input in = make_input(rng, SFMOE_DTYPE_FP32, {B, B}, cols, false, mix);
      for (int64_t r = 0; r < 2 * B; ++r) {
        for (int64_t c = 0; c < cols; ++c) in.set(r, c, (r + c) % 3 ? 0.75f : -0.0f);
      }
      // In group 0, each in its own 1D block in both directions (and one 2D block for all).
      struct Special {
        int64_t r, c;
        float x;
      };
      std::vector<Special> specials = {{1, 2, inf}, {2, 1, -inf}};
      if (with_nan) specials.push_back({3, 3, nan});
      for (const Special& s : specials) in.set(s.r, s.c, s.x);
      sfmoe_fault_report word{0, 0, -1, 0};
      Quantized q = quantize(in, recipe, B, 0, make_config(recipe, 0, 0, true), &word);
      SCOPED_TRACE(recipe.name() + (with_nan ? " with NaN" : " with Inf"));
      check_quantized(in, q, make_oracle(in, q));  // scales are the rules' values, rows in place
      const sfmoe_dtype dt = recipe.dtype;
      const uint32_t max_code = dt == SFMOE_DTYPE_FP8_E4M3   ? 0x7Eu
                                : dt == SFMOE_DTYPE_FP8_E5M2 ? 0x7Bu
                                                             : 0x7u;
      const uint32_t sign = dt == SFMOE_DTYPE_FP4_E2M1 ? 0x8u : 0x80u;
      EXPECT_EQ(word.flags, with_nan ? uint32_t{SFMOE_FAULT_NAN_AMAX} : 0u);
      if (with_nan) {
        EXPECT_EQ(word.first_group, 0);
      }
      if (is_nvfp4(recipe.scaling)) {
        if (with_nan) {
          EXPECT_TRUE(std::isnan(f32_at(q.amax, 0)));
        } else {
          EXPECT_EQ(f32_at(q.amax, 0), inf);
        }
      }
      for (int copy = 0; copy < 2; ++copy) {
        if (recipe.transformed(copy)) continue;  // the transform spreads Inf/NaN over the block
        auto code = [&](int64_t r, int64_t c) {
          return code_at(q.data[copy], dt, copy == 0 ? r * q.cols + c : c * q.rows + r);
        };
        const std::vector<uint8_t> out = dequantize(q, in, copy);
        auto decoded = [&](int64_t r, int64_t c) { return f32_at(out, r * q.cols + c); };
        for (const Special& s : specials) {
          const uint32_t scale = scale_value(q, copy, scale_entry(q, copy, s.r, s.c, 0));
          // TENSOR: the group is the block; a few of its elements.
          const auto elements =
              recipe.scaling == SFMOE_SCALING_TENSOR
                  ? std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {0, 1}, {s.r, s.c}}
                  : block_elements(q, copy, s.r, s.c);
          bool block_nan = false;
          for (const auto& e : elements)
            block_nan = block_nan || std::isnan(in.at(e.first, e.second));
          std::ostringstream where;
          where << (copy ? "columnwise" : "rowwise") << " block of (" << s.r << ", " << s.c << ")";
          SCOPED_TRACE(where.str());
          if (has_f32_scales(recipe.scaling)) {
            // FP8: scale 1; Inf saturates to +-max, NaN gives the NaN code, the rest unscaled.
            EXPECT_EQ(scale, nm::f32_to_bits(1.0f));
            for (const auto& e : elements) {
              const float x = in.at(e.first, e.second);
              const uint32_t want = std::isnan(x)   ? 0x7Fu
                                    : std::isinf(x) ? (x < 0 ? sign : 0u) | max_code
                                                    : sfmoe::encode_element(dt, x);
              EXPECT_EQ(code(e.first, e.second), want) << e.first << ", " << e.second;
            }
            const float d = decoded(s.r, s.c);
            if (std::isnan(s.x)) {
              EXPECT_TRUE(std::isnan(d));
            } else {
              EXPECT_EQ(d, std::copysign(fp8_max_of(dt), s.x));
            }
          } else if (recipe.scaling == SFMOE_SCALING_MX_1X32) {
            // Inf: E8M0 254, multiplier +0: finite values become zeros and Inf * 0 the NaN code.
            // NaN: E8M0 255, multiplier NaN: every code of the block is NaN and decodes to NaN.
            EXPECT_EQ(scale, block_nan ? 255u : 254u);
            for (const auto& e : elements) {
              const float x = in.at(e.first, e.second);
              const uint32_t want =
                  block_nan || !std::isfinite(x) ? 0x7Fu : (std::signbit(x) ? sign : 0u);
              EXPECT_EQ(code(e.first, e.second), want) << e.first << ", " << e.second;
              if (block_nan) {
                EXPECT_TRUE(std::isnan(decoded(e.first, e.second)));
              }
            }
          } else {
            // NVFP4. Inf: block scale e4m3(Inf) = 448 (0x7E), Inf codes +-6. NaN: block scale
            // 0x7F, multiplier FLT_MAX: +-6 for non-zero values (+6 for NaN), zeros stay; every
            // element decodes to NaN.
            EXPECT_EQ(scale, block_nan ? 0x7Fu : 0x7Eu);
            for (const auto& e : elements) {
              const float x = in.at(e.first, e.second);
              if (block_nan) {
                const uint32_t want = std::isnan(x) ? 0x7u
                                      : x == 0.0f   ? (std::signbit(x) ? sign : 0u)
                                                    : (std::signbit(x) ? sign : 0u) | 0x7u;
                EXPECT_EQ(code(e.first, e.second), want) << e.first << ", " << e.second;
                EXPECT_TRUE(std::isnan(decoded(e.first, e.second)));
              } else if (std::isinf(x)) {
                EXPECT_EQ(code(e.first, e.second), (x < 0 ? sign : 0u) | 0x7u);
                // The global scale falls back to 1 (amax Inf) or is FLT_MAX (amax NaN).
                const float global = with_nan ? nm::f32_max() : 1.0f;
                const float factor = nm::mul_rn(448.0f, nm::div_rn(1.0f, global));
                EXPECT_EQ(decoded(e.first, e.second), std::copysign(nm::mul_rn(6.0f, factor), x));
              }
            }
          }
        }
      }
    }
  }
}

TEST(CpuQuantize, NanAmaxFaultOnlyWhenTrapping) {
  struct Case {
    Recipe recipe;
    uint32_t events;  // one per NaN amax: each group amax written, each block of each copy
  };
  std::vector<Case> cases;
  auto add = [&](sfmoe_scaling s, sfmoe_dtype d, bool row, bool col, bool hadamard, uint32_t n) {
    Recipe r;
    r.scaling = s;
    r.dtype = d;
    r.rowwise = row;
    r.columnwise = col;
    r.hadamard = hadamard;
    cases.push_back({r, n});
  };
  add(SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3, true, true, false, 1);
  add(SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3, true, false, false, 1);
  add(SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3, true, true, false, 2);
  add(SFMOE_SCALING_BLOCK_128X128, SFMOE_DTYPE_FP8_E4M3, true, true, false, 1);
  add(SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E5M2, true, true, false, 2);
  add(SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, true, true, false, 3);
  add(SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1, true, true, true, 4);
  add(SFMOE_SCALING_NV_16X16, SFMOE_DTYPE_FP4_E2M1, true, true, false, 2);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.recipe.name());
    std::mt19937_64 rng(2);
    for (int nan_group : {-1, 1}) {
      ValueMix mix;
      mix.constants = false;
      Input in = make_input(rng, SFMOE_DTYPE_BF16, {128, 128}, 128, false, mix);
      if (nan_group >= 0) in.set(128 + 5, 7, std::nanf(""));
      in.set(3, 4, std::numeric_limits<float>::infinity());  // Inf never raises
      for (bool trap : {false, true}) {
        sfmoe_fault_report word{0, 0, -1, 0};
        quantize(in, c.recipe, 128, 0, make_config(c.recipe, 0, 0, trap), &word);
        const bool raised = trap && nan_group >= 0;
        EXPECT_EQ(word.flags, raised ? uint32_t{SFMOE_FAULT_NAN_AMAX} : 0u) << trap;
        EXPECT_EQ(word.count, raised ? c.events : 0u) << trap;
        EXPECT_EQ(word.first_group, raised ? 1 : -1) << trap;
      }
      quantize(in, c.recipe, 128, 0, make_config(c.recipe, 0, 0, true), nullptr);  // no word
    }
  }
}

TEST(CpuQuantize, GroupedAmaxPropagatesNanAndClampsBadOffsets) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x59u);
  for (sfmoe_dtype dtype : kInputDtypes) {
    for (bool uniform : {false, true}) {
      const std::vector<int64_t> sizes =
          uniform ? std::vector<int64_t>(5, 33) : std::vector<int64_t>{0, 1, 31, 33, 993, 0, 7};
      ValueMix mix;
      mix.nonfinite_group = 3;
      mix.extreme_group = 2;
      const Input in = make_input(rng, dtype, sizes, 40, uniform, mix);
      std::vector<float> amax(sizes.size() + 4, -1.0f);
      sfmoe_fault_report word{0, 0, -1, 0};
      sfmoe::cpu::grouped_amax(in.view(), in.groups(), in.cols, amax.data(), &word);
      for (int64_t g = 0; g < in.groups(); ++g) {
        const float want = amax_of(&in.values[in.begin(g) * in.cols], in.sizes[g] * in.cols);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(amax[g])) << g;
        } else {
          EXPECT_EQ(amax[g], want) << g;
        }
      }
      EXPECT_EQ(amax[in.groups()], -1.0f) << "wrote past num_groups";
      EXPECT_EQ(word.flags, 0u);
    }
  }
  // Bad offsets: clamped into [0, capacity] and made non-decreasing; faults recorded.
  Input in = make_input(rng, SFMOE_DTYPE_FP32, {100}, 8, false);
  for (int64_t r = 0; r < 100; ++r) {
    for (int64_t c = 0; c < 8; ++c) in.set(r, c, static_cast<float>(r));
  }
  in.capacity = 100;
  in.offsets = {0, 40, 20, 60, 200};
  in.sizes = {40, 0, 40, 40};
  float amax[4];
  sfmoe_fault_report word{0, 0, -1, 0};
  sfmoe::cpu::grouped_amax(in.view(), 4, 8, amax, &word);
  EXPECT_EQ(amax[0], 39.0f);
  EXPECT_EQ(amax[1], 0.0f);  // [40, 20) is empty
  EXPECT_EQ(amax[2], 59.0f);
  EXPECT_EQ(amax[3], 99.0f);  // [60, 200) clamped to [60, 100)
  EXPECT_EQ(word.flags, uint32_t{SFMOE_FAULT_BAD_GROUP_OFFSETS | SFMOE_FAULT_GROUP_OVER_CAPACITY});
  EXPECT_EQ(word.first_group, 1);
  sfmoe::cpu::grouped_amax(in.view(), 4, 8, amax, nullptr);  // no word: no faults, same result
  EXPECT_EQ(amax[3], 99.0f);
}

// The padded groups can exceed R: with bad offsets (decreasing ones make the clamped groups
// overlap), and with good ones when R is the input's capacity and that is not a multiple of a.
// out_off is then clamped to R, nothing is written out of bounds, and only lost data rows raise a
// fault.
TEST(CpuQuantize, PaddedGroupsAreClampedToTheCapacity) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x5Au);
  Input in = make_input(rng, SFMOE_DTYPE_BF16, {100}, 64, false);
  in.capacity = 100;
  in.offsets = {0, 80, 40, 100};
  in.sizes = {80, 0, 60};
  Recipe recipe;
  recipe.scaling = SFMOE_SCALING_MX_1X32;
  sfmoe_fault_report word{0, 0, -1, 0};
  // R = capacity + 3 * (a - 1) = 193 rounds to 224 with a = 32; out_off would be 0, 96, 96, 160.
  Quantized q = quantize(in, recipe, 32, 0, make_config(recipe, 0, 0, false), &word);
  EXPECT_EQ(q.rows, 224);
  EXPECT_EQ(std::vector<int64_t>(q.offsets.begin(), q.offsets.begin() + 4),
            (std::vector<int64_t>{0, 96, 96, 160}));
  EXPECT_EQ(word.flags, uint32_t{SFMOE_FAULT_BAD_GROUP_OFFSETS});
  // R at the input's capacity (what the API allows when a divides the input's alignment):
  // out_off is clamped to R. Rowwise MX_1X32 only, so R need not be a multiple of 32.
  recipe.columnwise = false;
  auto at_capacity = [&](const std::vector<int64_t>& offsets, int64_t a, uint32_t flags,
                         const std::vector<int64_t>& out_off) {
    in.offsets = offsets;
    Quantized small;
    small.recipe = recipe;
    small.groups = static_cast<int64_t>(offsets.size()) - 1;
    small.cols = 64;
    small.rows = 100;
    small.alignment = a;
    small.config = make_config(recipe, 0, 0, false);
    small.offsets.assign(8, poisoned_i64());
    small.data[0].assign(static_cast<size_t>(small.data_bytes() + kSlack), kPoison);
    small.scales[0].assign(static_cast<size_t>(small.scale_bytes(0) + kSlack), kPoison);
    small.amax.assign(64, kPoison);
    small.columnwise_amax.assign(64, kPoison);
    sfmoe_fault_report report{0, 0, -1, 0};
    sfmoe::cpu::grouped_quantize(small.args(in, &report));
    EXPECT_EQ(std::vector<int64_t>(small.offsets.begin(), small.offsets.begin() + offsets.size()),
              out_off);
    EXPECT_TRUE(poisoned(small.data[0], small.data_bytes(), small.data_bytes() + kSlack));
    EXPECT_TRUE(poisoned(small.scales[0], small.scale_bytes(0), small.scale_bytes(0) + kSlack));
    EXPECT_EQ(report.flags, flags);
    return small;
  };
  // Overlapping groups: 80 + 60 rows do not fit in 100; the lost rows raise a fault.
  at_capacity({0, 80, 40, 100}, 1, SFMOE_FAULT_BAD_GROUP_OFFSETS | SFMOE_FAULT_GROUP_OVER_CAPACITY,
              {0, 80, 80, 100});
  // Good offsets aligned to 32 whose last group ends at a capacity that is not: its padding
  // (rows 100..127) is cut, its data rows all fit, no fault.
  for (int64_t r = 96; r < 100; ++r) {
    for (int64_t c = 0; c < 64; ++c) in.set(r, c, 1.0f + static_cast<float>((r * 64 + c) % 7) / 8);
  }
  Quantized q2 = at_capacity({0, 96, 100}, 32, 0, {0, 96, 100});
  std::vector<uint8_t> out(static_cast<size_t>(100 * 64 * 4), kPoison);
  GroupedDequantizeArgs d;
  std::memset(&d, 0, sizeof(d));
  d.quantized = q2.args(in, nullptr);
  d.output = out.data();
  d.output_dtype = SFMOE_DTYPE_FP32;
  sfmoe::cpu::grouped_dequantize(d);
  for (int64_t r = 96; r < 100; ++r) {
    for (int64_t c = 0; c < 64; ++c) {
      const float x = in.at(r, c), decoded = f32_at(out, r * 64 + c);
      EXPECT_LE(std::fabs(decoded - x), std::fabs(x) / 16) << r << ", " << c;
    }
  }
}

TEST(CpuQuantize, DequantizeToBf16AndFp16IsTheFp32ResultEncoded) {
  std::mt19937_64 rng(sfmoe::testing::session_test_seed() ^ 0x5Bu);
  for (const Recipe& recipe : all_recipes()) {
    if (recipe.pow2 || recipe.dtype == SFMOE_DTYPE_FP8_E5M2) continue;
    const Input in = make_input(rng, SFMOE_DTYPE_BF16, {20, 0, 140}, cols_for(recipe), false);
    Quantized q =
        quantize(in, recipe, 128, 5 * row_block(recipe), make_config(recipe, 1, 2, false));
    const int64_t end = expected_out_off(in, 128).back();
    for (int copy = 0; copy < 2; ++copy) {
      const std::vector<uint8_t> f32 = dequantize(q, in, copy);
      for (sfmoe_dtype dtype : {SFMOE_DTYPE_BF16, SFMOE_DTYPE_FP16}) {
        const std::vector<uint8_t> out = dequantize(q, in, copy, dtype);
        Failures f(recipe.name() + " to " + sfmoe_dtype_name(dtype));
        for (int64_t i = 0; i < end * q.cols; ++i) {
          f.expect(
              sfmoe::load_code(out.data(), 16, i) == sfmoe::encode_element(dtype, f32_at(f32, i)),
              [&] { return at("element", i / q.cols, i % q.cols); });
        }
        f.check(poisoned(out, end * q.cols * 2, static_cast<int64_t>(out.size())),
                "wrote at or beyond out_off[G]");
      }
    }
  }
}

}  // namespace

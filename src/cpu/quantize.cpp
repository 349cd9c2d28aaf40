// Grouped quantization on the CPU: the definition of docs/quantization.md as plain loops over the
// numerics headers. The CUDA kernels are checked against these bytes, so every value goes through
// the same numerics functions in the order the specification gives.
#include <algorithm>
#include <vector>

#include "sfmoe/numerics.h"
#include "src/common/element_codec.h"
#include "src/common/group_offsets.h"
#include "src/cpu/backend.h"

namespace sfmoe {
namespace cpu {
namespace {

using numerics::amax_accumulate;
using numerics::f32_is_nan;
using numerics::mul_rn;

constexpr int64_t kMaxBlock = 128;

// Rows of input group g. Uniform groups are clamped into the capacity the way offsets are.
// GroupedInput carries no row alignment, so the input's offsets are checked with alignment 1:
// a misaligned input offset only matters through the padded layout, which out_off re-aligns.
GroupRows input_group_rows(const GroupedInput& input, int64_t g, sfmoe_fault_report* word) {
  if (input.uniform_rows > 0) {
    const int64_t begin = std::min(g * input.uniform_rows, input.row_capacity);
    return GroupRows{begin, std::min(begin + input.uniform_rows, input.row_capacity)};
  }
  if (word != nullptr) check_group(input.offsets, g, input.row_capacity, 1, word);
  return clamp_group_rows(input.offsets, g, input.row_capacity);
}

// The input matrix [row_capacity, cols] read as FP32.
struct InputMatrix {
  const GroupedInput& input;
  int64_t cols;
  int bits;
  InputMatrix(const GroupedInput& in, int64_t columns)
      : input(in), cols(columns), bits(sfmoe_dtype_bits(in.dtype)) {}
  float at(int64_t row, int64_t col) const {
    return decode_element(input.dtype, load_code(input.data, bits, row * cols + col));
  }
};

void store_code(void* data, int bits, int64_t index, uint32_t code) {
  switch (bits) {
    case 32:
      static_cast<uint32_t*>(data)[index] = code;
      break;
    case 16:
      static_cast<uint16_t*>(data)[index] = static_cast<uint16_t>(code);
      break;
    case 8:
      static_cast<uint8_t*>(data)[index] = static_cast<uint8_t>(code);
      break;
    default: {  // FP4: element 2i in the low nibble
      uint8_t& byte = static_cast<uint8_t*>(data)[index >> 1];
      const int shift = static_cast<int>(index & 1) * 4;
      byte = static_cast<uint8_t>((byte & ~(0xF << shift)) | ((code & 0xF) << shift));
    }
  }
}

// The padded output matrix [R, C] of docs/quantization.md: which input row (or padding zero) each
// output row holds and which group it belongs to, for rows [0, out_off[G]).
struct PaddedMatrix {
  explicit PaddedMatrix(const GroupedQuantizeArgs& args) : input(args.input, args.cols) {}
  // Element (r, c), r < end; padding rows are zeros.
  float value(int64_t r, int64_t c) const {
    const int64_t source = source_row[r];
    return source < 0 ? 0.0f : input.at(source, c);
  }
  InputMatrix input;
  std::vector<int64_t> out_off;       // num_groups + 1
  std::vector<int64_t> source_row;    // [end]: the input row, or -1 for a padding row
  std::vector<int64_t> group_of_row;  // [end]
  int64_t end = 0;                    // out_off[num_groups]
};

// out_off[g + 1] = out_off[g] + roundup(n_g, a). The API's capacity rule makes this fit whenever
// the input offsets are good; with bad ones (decreasing offsets make clamped groups overlap) the
// sum can pass R, so it is clamped to the largest row count that keeps the recipe's row-running
// blocks whole, and a group whose data rows no longer fit raises GROUP_OVER_CAPACITY: nothing is
// written out of bounds and nothing is lost silently.
PaddedMatrix plan_rows(const GroupedQuantizeArgs& args) {
  const int64_t a = args.row_alignment;
  const int64_t block_height = min_row_alignment(args.scaling, args.columnwise != nullptr);
  const int64_t row_limit = args.row_capacity - args.row_capacity % block_height;
  PaddedMatrix plan(args);
  plan.out_off.assign(static_cast<size_t>(args.num_groups + 1), 0);
  std::vector<GroupRows> input_rows(static_cast<size_t>(args.num_groups));
  for (int64_t g = 0; g < args.num_groups; ++g) {
    input_rows[g] = input_group_rows(args.input, g, args.word);
  }
  for (int64_t g = 0; g < args.num_groups; ++g) {
    const int64_t n = input_rows[g].end - input_rows[g].begin;
    const int64_t padded_end = plan.out_off[g] + numerics::round_up(n, a);
    if (args.word != nullptr && plan.out_off[g] + n > row_limit) {
      raise_fault(args.word, SFMOE_FAULT_GROUP_OVER_CAPACITY, g, plan.out_off[g] + n);
    }
    plan.out_off[g + 1] = std::min(padded_end, row_limit);
  }
  plan.end = plan.out_off[args.num_groups];
  plan.source_row.assign(static_cast<size_t>(plan.end), -1);
  plan.group_of_row.assign(static_cast<size_t>(plan.end), 0);
  for (int64_t g = 0; g < args.num_groups; ++g) {
    const int64_t n = input_rows[g].end - input_rows[g].begin;
    for (int64_t r = plan.out_off[g]; r < plan.out_off[g + 1]; ++r) {
      const int64_t i = r - plan.out_off[g];
      plan.source_row[r] = i < n ? input_rows[g].begin + i : -1;
      plan.group_of_row[r] = g;
    }
  }
  return plan;
}

// Group amax over the group's rows of the padded matrix (padding zeros leave it unchanged).
std::vector<float> group_amax(const GroupedQuantizeArgs& args, const PaddedMatrix& plan) {
  std::vector<float> amax(static_cast<size_t>(args.num_groups), 0.0f);
  for (int64_t g = 0; g < args.num_groups; ++g) {
    for (int64_t r = plan.out_off[g]; r < plan.out_off[g + 1]; ++r) {
      if (plan.source_row[r] < 0) continue;
      for (int64_t c = 0; c < args.cols; ++c) {
        amax[g] = amax_accumulate(amax[g], plan.value(r, c));
      }
    }
  }
  return amax;
}

void trap_nan(const GroupedQuantizeArgs& args, float amax, int64_t group, int64_t first_row) {
  // The fault's value is the first output row of the block (or group) whose amax is NaN.
  if (args.config.trap_nan_amax && args.word != nullptr && f32_is_nan(amax)) {
    raise_fault(args.word, SFMOE_FAULT_NAN_AMAX, group, first_row);
  }
}

float fp8_max(sfmoe_dtype dtype) {
  return dtype == SFMOE_DTYPE_FP8_E5M2 ? numerics::kE5M2Max : numerics::kE4M3Max;
}

// One copy of the output seen as its own matrix [rows, cols]: the rowwise copy is the padded
// matrix, the columnwise copy its transpose. Element (m, n) of the copy is element (n, m) of the
// padded matrix when columnwise; blocks run along the copy's rows (along n).
struct Copy {
  bool columnwise;
  void* data;
  void* scale_inv;
  int64_t rows, cols;
  // The padded-matrix row of copy element (m, n): rows at and beyond plan.end are not written.
  int64_t matrix_row(int64_t m, int64_t n) const { return columnwise ? n : m; }
  int64_t matrix_col(int64_t m, int64_t n) const { return columnwise ? m : n; }
};

std::vector<Copy> copies_of(const GroupedQuantizeArgs& args) {
  std::vector<Copy> copies;
  if (args.rowwise != nullptr) {
    copies.push_back(
        Copy{false, args.rowwise, args.rowwise_scale_inv, args.row_capacity, args.cols});
  }
  if (args.columnwise != nullptr) {
    copies.push_back(
        Copy{true, args.columnwise, args.columnwise_scale_inv, args.cols, args.row_capacity});
  }
  return copies;
}

// Writes the code of copy element (m, n) from its value times the block's multiplier: an FP8
// code, or E2M1 rounded to nearest or stochastically from the element's Philox bits.
struct Encoder {
  const GroupedQuantizeArgs& args;
  int bits;
  uint32_t encode(const Copy& copy, int64_t m, int64_t n, float scaled) const {
    if (args.dtype != SFMOE_DTYPE_FP4_E2M1) return encode_element(args.dtype, scaled);
    if (!args.config.stochastic_rounding) return numerics::f32_to_e2m1(scaled);
    // Rowwise (r, c) draws element r * C + c of stream 2 * offset; columnwise (c, r) draws
    // element c * R + r of stream 2 * offset + 1: both are m * cols + n of the copy.
    const uint64_t offset =
        args.config.offset + (args.config.offset_device ? *args.config.offset_device : 0);
    const uint64_t stream = 2 * offset + (copy.columnwise ? 1 : 0);
    const uint32_t random_bits = numerics::philox_random_bits(
        args.config.seed, stream, static_cast<uint64_t>(m * copy.cols + n));
    return numerics::f32_to_e2m1_stochastic(scaled, random_bits);
  }
  void store(const Copy& copy, int64_t m, int64_t n, float scaled) const {
    store_code(copy.data, bits, m * copy.cols + n, encode(copy, m, n, scaled));
  }
};

// Per-block scale of the block recipes: the multiplier applied to the values, and what is stored.
struct BlockScale {
  float multiplier;
  float scale_inv;     // FP32 storage (BLOCK_*)
  uint8_t scale_code;  // byte storage (E8M0 for MX, E4M3 for NV)
};

BlockScale block_scale(const GroupedQuantizeArgs& args, float block_amax, float global_scale) {
  BlockScale s{1.0f, 1.0f, 0};
  switch (args.scaling) {
    case SFMOE_SCALING_BLOCK_1X128:
    case SFMOE_SCALING_BLOCK_128X128:
      s.multiplier = numerics::fp8_scale_from_amax(block_amax, fp8_max(args.dtype),
                                                   args.config.power_of_two_scales != 0);
      s.scale_inv = numerics::scale_inverse(s.multiplier);
      break;
    case SFMOE_SCALING_MX_1X32:
      s.scale_code = numerics::mx_scale_from_amax(block_amax, fp8_max(args.dtype));
      s.multiplier = numerics::mx_multiplier(s.scale_code);
      break;
    case SFMOE_SCALING_NV_1X16:
    case SFMOE_SCALING_NV_16X16:
      s.scale_code = numerics::nvfp4_block_scale(block_amax, global_scale);
      s.multiplier = numerics::nvfp4_block_multiplier(s.scale_code, global_scale);
      break;
    default:
      break;
  }
  return s;
}

void store_scale(const GroupedQuantizeArgs& args, void* scales, int64_t offset,
                 const BlockScale& s) {
  if (args.scaling == SFMOE_SCALING_BLOCK_1X128 || args.scaling == SFMOE_SCALING_BLOCK_128X128) {
    static_cast<float*>(scales)[offset] = s.scale_inv;
  } else {
    static_cast<uint8_t*>(scales)[offset] = s.scale_code;
  }
}

bool hadamard_applies(const GroupedQuantizeArgs& args, const Copy& copy) {
  // The transform is defined for NV_1X16's columnwise copy only; the flag does nothing elsewhere.
  return copy.columnwise && args.scaling == SFMOE_SCALING_NV_1X16 &&
         args.config.hadamard_columnwise != 0;
}

// Block (m, k) of a 1D copy: the values at copy positions (m, k * B + j), j < B, transformed when
// the copy takes the Hadamard transform.
void gather_1d_block(const GroupedQuantizeArgs& args, const PaddedMatrix& plan, const Copy& copy,
                     int64_t m, int64_t k, int64_t block, float* values) {
  for (int64_t j = 0; j < block; ++j) {
    const int64_t n = k * block + j;
    values[j] = plan.value(copy.matrix_row(m, n), copy.matrix_col(m, n));
  }
  if (hadamard_applies(args, copy)) numerics::hadamard16_transform(values);
}

// The propagating max over the transformed columnwise blocks of each group (columnwise_amax).
std::vector<float> transformed_columnwise_amax(const GroupedQuantizeArgs& args,
                                               const PaddedMatrix& plan, const Copy& copy) {
  std::vector<float> amax(static_cast<size_t>(args.num_groups), 0.0f);
  const int64_t block = numerics::kHadamardSize;
  float values[numerics::kHadamardSize];
  for (int64_t k = 0; k * block < plan.end; ++k) {
    const int64_t g = plan.group_of_row[k * block];
    for (int64_t m = 0; m < copy.rows; ++m) {
      gather_1d_block(args, plan, copy, m, k, block, values);
      for (int64_t j = 0; j < block; ++j) amax[g] = amax_accumulate(amax[g], values[j]);
    }
  }
  return amax;
}

// TENSOR: one scale per group, from the group amax or given (tensor_scale_of_group); every element
// of the group is fp8(x * s).
void quantize_tensor(const GroupedQuantizeArgs& args, const PaddedMatrix& plan,
                     const std::vector<float>& amax) {
  const Encoder encoder{args, 8};
  std::vector<float> scale(static_cast<size_t>(args.num_groups));
  for (int64_t g = 0; g < args.num_groups; ++g) {
    trap_nan(args, amax[g], g, plan.out_off[g]);
    scale[g] = tensor_scale_of_group(args.config, g, amax[g], fp8_max(args.dtype));
  }
  for (const Copy& copy : copies_of(args)) {
    for (int64_t g = 0; g < args.num_groups; ++g) {
      static_cast<float*>(copy.scale_inv)[g] = numerics::scale_inverse(scale[g]);
    }
    for (int64_t r = 0; r < plan.end; ++r) {
      const float s = scale[plan.group_of_row[r]];
      for (int64_t c = 0; c < args.cols; ++c) {
        const int64_t m = copy.columnwise ? c : r, n = copy.columnwise ? r : c;
        encoder.store(copy, m, n, mul_rn(plan.value(r, c), s));
      }
    }
  }
}

// 1D blocks (BLOCK_1X128, MX_1X32, NV_1X16): B consecutive elements of a copy row share a scale,
// stored at (m, k) of the copy's [rows, cols / B] scale matrix.
void quantize_1d(const GroupedQuantizeArgs& args, const PaddedMatrix& plan, const Copy& copy,
                 const std::vector<float>& global_amax) {
  const int64_t block = scaling_block_size(args.scaling);
  const int64_t scale_cols = copy.cols / block;
  const bool swizzlable =
      args.scaling == SFMOE_SCALING_MX_1X32 || args.scaling == SFMOE_SCALING_NV_1X16;
  const sfmoe_scale_layout layout = swizzlable ? args.scale_layout : SFMOE_SCALE_LAYOUT_COMPACT;
  const bool nvfp4 = scaling_is_nvfp4(args.scaling);
  const Encoder encoder{args, sfmoe_dtype_bits(args.dtype)};
  std::vector<float> global_scale(static_cast<size_t>(args.num_groups), 1.0f);
  if (nvfp4) {
    for (int64_t g = 0; g < args.num_groups; ++g) {
      global_scale[g] = numerics::nvfp4_global_encode_scale(global_amax[g]);
    }
  }
  float values[kMaxBlock];
  for (int64_t m = 0; m < copy.rows; ++m) {
    for (int64_t k = 0; k < scale_cols; ++k) {
      const int64_t first_row = copy.matrix_row(m, k * block);
      if (first_row >= plan.end) continue;  // rows at and beyond out_off[G] are not written
      const int64_t g = plan.group_of_row[first_row];
      gather_1d_block(args, plan, copy, m, k, block, values);
      float block_amax = 0.0f;
      for (int64_t j = 0; j < block; ++j) block_amax = amax_accumulate(block_amax, values[j]);
      trap_nan(args, block_amax, g, first_row);
      const BlockScale s = block_scale(args, block_amax, global_scale[g]);
      const int64_t at = args.scaling == SFMOE_SCALING_BLOCK_1X128
                             ? block_1x128_scale_offset(args.scale_layout, copy.columnwise, m, k,
                                                        scale_cols, copy.rows)
                             : scale_offset(layout, m, k, scale_cols);
      store_scale(args, copy.scale_inv, at, s);
      for (int64_t j = 0; j < block; ++j) {
        encoder.store(copy, m, k * block + j, mul_rn(values[j], s.multiplier));
      }
    }
  }
  // The swizzled layout pads the scale matrix to [roundup(rows, 128), roundup(scale_cols, 4)].
  // Padding entries that sit beside written blocks are written as 0 (rowwise: padding columns of
  // rows below out_off[G]; columnwise: padding rows under written row blocks); the ones at rows
  // at and beyond out_off[G] are left alone like every other entry there.
  if (layout == SFMOE_SCALE_LAYOUT_SWIZZLED) {
    const int64_t padded_rows = numerics::round_up(copy.rows, numerics::kSwizzleTileRows);
    const int64_t padded_cols = numerics::round_up(scale_cols, numerics::kSwizzleTileCols);
    for (int64_t i = 0; i < padded_rows; ++i) {
      for (int64_t k = 0; k < padded_cols; ++k) {
        if (i < copy.rows && k < scale_cols) continue;
        if (copy.matrix_row(i, k * block) >= plan.end) continue;
        static_cast<uint8_t*>(copy.scale_inv)[numerics::swizzled_scale_offset(i, k, scale_cols)] =
            0;
      }
    }
  }
}

// 2D blocks (BLOCK_128X128, NV_16X16): B x B squares of the padded matrix share one scale, the
// same for both copies: rowwise at (r / B, c / B) of [R / B, C / B], columnwise at (c / B, r / B)
// of [C / B, R / B]. The codes of the two copies differ only through stochastic rounding.
void quantize_2d(const GroupedQuantizeArgs& args, const PaddedMatrix& plan,
                 const std::vector<float>& global_amax) {
  const int64_t block = scaling_block_size(args.scaling);
  const int64_t block_cols = args.cols / block;
  const int64_t block_rows_capacity = args.row_capacity / block;
  const Encoder encoder{args, sfmoe_dtype_bits(args.dtype)};
  const std::vector<Copy> copies = copies_of(args);
  std::vector<float> values(static_cast<size_t>(block * block));
  for (int64_t br = 0; br * block < plan.end; ++br) {
    const int64_t g = plan.group_of_row[br * block];
    const float global_scale =
        scaling_is_nvfp4(args.scaling) ? numerics::nvfp4_global_encode_scale(global_amax[g]) : 1.0f;
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      float block_amax = 0.0f;
      for (int64_t i = 0; i < block; ++i) {
        for (int64_t j = 0; j < block; ++j) {
          values[i * block + j] = plan.value(br * block + i, bc * block + j);
          block_amax = amax_accumulate(block_amax, values[i * block + j]);
        }
      }
      trap_nan(args, block_amax, g, br * block);
      const BlockScale s = block_scale(args, block_amax, global_scale);
      // (rowwise scales without rowwise codes: quantize_args.h)
      if (args.rowwise == nullptr && args.rowwise_scale_inv != nullptr)
        store_scale(args, args.rowwise_scale_inv, br * block_cols + bc, s);
      for (const Copy& copy : copies) {
        const int64_t offset =
            copy.columnwise ? bc * block_rows_capacity + br : br * block_cols + bc;
        store_scale(args, copy.scale_inv, offset, s);
        for (int64_t i = 0; i < block; ++i) {
          for (int64_t j = 0; j < block; ++j) {
            const int64_t r = br * block + i, c = bc * block + j;
            const float scaled = mul_rn(values[i * block + j], s.multiplier);
            if (copy.columnwise) {
              encoder.store(copy, c, r, scaled);
            } else {
              encoder.store(copy, r, c, scaled);
            }
          }
        }
      }
    }
  }
}

}  // namespace

void grouped_amax(const GroupedInput& input, int64_t num_groups, int64_t cols, float* amax,
                  sfmoe_fault_report* word) {
  const InputMatrix matrix(input, cols);
  for (int64_t g = 0; g < num_groups; ++g) {
    const GroupRows rows = input_group_rows(input, g, word);
    float group_amax = 0.0f;
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        group_amax = amax_accumulate(group_amax, matrix.at(r, c));
      }
    }
    amax[g] = group_amax;
  }
}

void grouped_quantize(const GroupedQuantizeArgs& args) {
  const PaddedMatrix plan = plan_rows(args);
  if (args.uniform_rows == 0) {
    for (int64_t g = 0; g <= args.num_groups; ++g) args.offsets[g] = plan.out_off[g];
  }

  // Group amax (TENSOR, NVFP4), computed or given (config.group_amax): written for every group,
  // NaN traps once per group.
  std::vector<float> amax;
  if (args.scaling == SFMOE_SCALING_TENSOR || scaling_is_nvfp4(args.scaling)) {
    if (args.config.group_amax != nullptr) {
      amax.assign(args.config.group_amax, args.config.group_amax + args.num_groups);
    } else {
      amax = group_amax(args, plan);
    }
    for (int64_t g = 0; g < args.num_groups; ++g) args.amax[g] = amax[g];
  }
  if (args.scaling == SFMOE_SCALING_TENSOR) {
    quantize_tensor(args, plan, amax);  // traps the group amax (it is the block amax)
    return;
  }
  if (scaling_is_nvfp4(args.scaling)) {
    for (int64_t g = 0; g < args.num_groups; ++g) trap_nan(args, amax[g], g, plan.out_off[g]);
  }
  if (scaling_is_2d(args.scaling)) {
    quantize_2d(args, plan, amax);
    return;
  }
  for (const Copy& copy : copies_of(args)) {
    if (hadamard_applies(args, copy)) {
      const std::vector<float> columnwise_amax = transformed_columnwise_amax(args, plan, copy);
      for (int64_t g = 0; g < args.num_groups; ++g) {
        args.columnwise_amax[g] = columnwise_amax[g];
        trap_nan(args, columnwise_amax[g], g, plan.out_off[g]);
      }
      quantize_1d(args, plan, copy, columnwise_amax);
    } else {
      quantize_1d(args, plan, copy, amax);
    }
  }
}

void grouped_dequantize(const GroupedDequantizeArgs& args) {
  const GroupedQuantizeArgs& q = args.quantized;
  const int64_t R = q.row_capacity, C = q.cols;
  const void* codes = args.from_columnwise ? q.columnwise : q.rowwise;
  const int code_bits = sfmoe_dtype_bits(q.dtype);
  const int out_bits = sfmoe_dtype_bits(args.output_dtype);
  const bool inverse_transform = args.from_columnwise && q.scaling == SFMOE_SCALING_NV_1X16 &&
                                 q.config.hadamard_columnwise != 0;
  const bool uniform = q.uniform_rows > 0;
  const int64_t end = dequantized_rows(q);
  auto decode = [&](int64_t r, int64_t c, int64_t g) {
    const int64_t index = args.from_columnwise ? c * R + r : r * C + c;
    const float value = decode_element(q.dtype, load_code(codes, code_bits, index));
    return mul_rn(value, dequantize_factor(q, args.from_columnwise, r, c, g,
                                           dequantize_global_decode(q, args.from_columnwise, g)));
  };
  auto store = [&](int64_t r, int64_t c, float value) {
    store_code(args.output, out_bits, r * C + c, encode_element(args.output_dtype, value));
  };

  // Rows [0, end) are all written: those no group covers (only bad offsets leave any) as zeros.
  for (int64_t r = 0; r < end; ++r) {
    for (int64_t c = 0; c < C; ++c) store(r, c, 0.0f);
  }
  for (int64_t g = 0; g < q.num_groups; ++g) {
    GroupRows rows;
    if (uniform) {
      rows.begin = std::min(g * q.uniform_rows, end);
      rows.end = std::min(rows.begin + q.uniform_rows, end);
    } else {
      rows = clamp_group_rows(q.offsets, g, end);
    }
    if (!inverse_transform) {
      for (int64_t r = rows.begin; r < rows.end; ++r) {
        for (int64_t c = 0; c < C; ++c) store(r, c, decode(r, c, g));
      }
      continue;
    }
    // Transform blocks are 16 rows of one column aligned at multiples of 16; the output's
    // alignment keeps each inside its group.
    const int64_t block = numerics::kHadamardSize;
    float v[numerics::kHadamardSize];
    for (int64_t r0 = numerics::round_up(rows.begin, block); r0 + block <= rows.end; r0 += block) {
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t j = 0; j < block; ++j) v[j] = decode(r0 + j, c, g);
        numerics::hadamard16_inverse(v);
        for (int64_t j = 0; j < block; ++j) store(r0 + j, c, v[j]);
      }
    }
  }
}

void swizzle_scales(const uint8_t* compact, int64_t rows, int64_t scale_cols, uint8_t* swizzled) {
  const int64_t padded = numerics::swizzled_scale_padded_size(rows, scale_cols);
  for (int64_t i = 0; i < padded; ++i) swizzled[i] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < scale_cols; ++k) {
      swizzled[numerics::swizzled_scale_offset(r, k, scale_cols)] = compact[r * scale_cols + k];
    }
  }
}

void unswizzle_scales(const uint8_t* swizzled, int64_t rows, int64_t scale_cols, uint8_t* compact) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < scale_cols; ++k) {
      compact[r * scale_cols + k] = swizzled[numerics::swizzled_scale_offset(r, k, scale_cols)];
    }
  }
}

}  // namespace cpu
}  // namespace sfmoe
